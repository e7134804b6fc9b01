"""Helpers for tests/test_gguf.py: a tiny raw GGUF byte builder, so tests can write exactly the
malformed field they want (hostile counts, bad types, misaligned offsets) without going through
gguf.GGUFWriter, which refuses to write most of them.

    b = RawGGUF()
    b.kv_u32("general.alignment", 32)
    b.tensor("w", [32, 2], type_id=0)          # data filled with zeros, placed aligned
    data = b.build()                            # bytes of a valid file
    data = b.build(n_tensors=2**63 - 1)         # ... with a lying header count
"""
from __future__ import annotations

import struct

# GGUF metadata value type ids (gguf.GGUFValueType)
VT_UINT8, VT_INT8, VT_UINT16, VT_INT16, VT_UINT32, VT_INT32, VT_FLOAT32, VT_BOOL = range(8)
VT_STRING, VT_ARRAY, VT_UINT64, VT_INT64, VT_FLOAT64 = 8, 9, 10, 11, 12


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string; `length` overrides the length field (to lie about it)."""
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b) if length is None else length) + b


class RawGGUF:
    """Builds GGUF bytes field by field. Tensor data offsets are laid out in order and aligned
    unless given explicitly."""

    def __init__(self, version: int = 3, alignment: int = 32, magic: bytes = b"GGUF"):
        self.version = version
        self.alignment = alignment
        self.magic = magic
        self.kvs: list[bytes] = []
        self.infos: list[tuple] = []   # (name, ne, type_id, offset or None, nbytes, n_dims)

    # ---- metadata
    def kv_raw(self, key: str, vtype: int, payload: bytes) -> "RawGGUF":
        self.kvs.append(gstr(key) + u32(vtype) + payload)
        return self

    def kv_u32(self, key: str, v: int) -> "RawGGUF":
        return self.kv_raw(key, VT_UINT32, u32(v))

    def kv_str(self, key: str, s: str) -> "RawGGUF":
        return self.kv_raw(key, VT_STRING, gstr(s))

    def kv_array(self, key: str, etype: int, count: int, body: bytes) -> "RawGGUF":
        return self.kv_raw(key, VT_ARRAY, u32(etype) + u64(count) + body)

    # ---- tensors
    def tensor(self, name: str, ne: list[int], type_id: int = 0, nbytes: int | None = None,
               offset: int | None = None, n_dims: int | None = None) -> "RawGGUF":
        """ne in ggml order. nbytes defaults to ne product * 4 (F32); offset to the next aligned
        slot. n_dims overrides the count written (to lie about it)."""
        if nbytes is None:
            nbytes = 4
            for d in ne:
                nbytes *= d
        self.infos.append((name, list(ne), type_id, offset, nbytes, n_dims))
        return self

    def build(self, n_tensors: int | None = None, n_kv: int | None = None,
              data: bool = True) -> bytes:
        out = bytearray(self.magic + u32(self.version))
        out += u64(len(self.infos) if n_tensors is None else n_tensors)
        out += u64(len(self.kvs) if n_kv is None else n_kv)
        for kv in self.kvs:
            out += kv
        pos = 0
        spans = []
        for name, ne, type_id, offset, nbytes, n_dims in self.infos:
            if offset is None:
                offset = pos
            pos = max(pos, offset + nbytes)
            pos = -(-pos // self.alignment) * self.alignment
            spans.append((offset, nbytes))
            out += gstr(name) + u32(len(ne) if n_dims is None else n_dims)
            for d in ne:
                out += u64(d)
            out += u32(type_id) + u64(offset)
        if data and self.infos:
            out += bytes(-len(out) % self.alignment)
            data_start = len(out)
            end = max(o + n for o, n in spans)
            if end < 1 << 24:   # only real-sized data is written; lies stay lies
                out += bytes(end)
                for i, (o, n) in enumerate(spans):   # recognisable contents
                    out[data_start + o:data_start + o + min(n, 4)] = bytes([i + 1] * min(n, 4))
        return bytes(out)
