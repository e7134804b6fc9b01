"""GGUF reader: memory-maps a GGUF v2/v3 file, validates every field, exposes metadata and
zero-copy tensor views.

    with GGUFFile("model.gguf") as f:          # or load_gguf(path)
        f.architecture                         # "llama"
        f.arch_get("block_count")              # f.get("llama.block_count") -> 30
        t = f.tensors["token_embd.weight"]     # TensorInfo
        t.shape, t.type_name, t.data           # ggml order (ne0 first), "Q8_0", numpy view

File layout (little-endian; ggml's gguf.cpp is the reference):

    u32 magic "GGUF" | u32 version (2, 3) | u64 n_tensors | u64 n_kv
    n_kv x      { str key | u32 value_type | value }
    n_tensors x { str name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
    padding to `general.alignment` (default 32) -> data section (tensor offsets are relative to it)

    str = u64 length + UTF-8 bytes (no terminator); array value = u32 elem_type + u64 count + elems.

Everything is checked before it is used: a count is compared with the bytes left in the file
before anything is allocated for it, so a corrupt or hostile file raises ModelFormatError (with
the path, the byte offset and the key or tensor name) and never crashes, hangs or allocates
gigabytes. Metadata is copied out of the map (it is small); tensor data is not: `TensorInfo.data`
is a read-only numpy view into the map.

We do not use gguf.GGUFReader for parsing: it allocates from counts before checking them and
raises assorted exceptions on corrupt input. Only the `gguf` package's constants are used.
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import stat
import struct
from typing import Any, Iterator

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, LlamaFileType

from llmrt import _core
from llmrt.checks import is_int
from llmrt.errors import ModelFormatError

log = logging.getLogger("llmrt")

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
MAX_ARRAY_DEPTH = 3          # array of arrays of arrays is the deepest we accept (ggml accepts 1)
INT64_MAX = (1 << 63) - 1

# Smallest possible encodings, used to reject counts that cannot fit in the bytes left.
_MIN_KV_BYTES = 8 + 4 + 1            # key length, value type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, ne[0], type, offset

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# value type -> (struct format, numpy dtype) for fixed-size scalars
_SCALAR = {
    GGUFValueType.UINT8: ("<B", np.dtype("<u1")),
    GGUFValueType.INT8: ("<b", np.dtype("<i1")),
    GGUFValueType.UINT16: ("<H", np.dtype("<u2")),
    GGUFValueType.INT16: ("<h", np.dtype("<i2")),
    GGUFValueType.UINT32: ("<I", np.dtype("<u4")),
    GGUFValueType.INT32: ("<i", np.dtype("<i4")),
    GGUFValueType.FLOAT32: ("<f", np.dtype("<f4")),
    GGUFValueType.BOOL: ("<B", np.dtype("<u1")),   # one byte, 0 or 1
    GGUFValueType.UINT64: ("<Q", np.dtype("<u8")),
    GGUFValueType.INT64: ("<q", np.dtype("<i8")),
    GGUFValueType.FLOAT64: ("<d", np.dtype("<f8")),
}
_SCALAR_STRUCT = {int(k): struct.Struct(fmt) for k, (fmt, _) in _SCALAR.items()}
_SCALAR_DTYPE = {int(k): dt for k, (_, dt) in _SCALAR.items()}
_INT_VALUE_TYPES = {int(t) for t in (GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16,
                                     GGUFValueType.INT16, GGUFValueType.UINT32, GGUFValueType.INT32,
                                     GGUFValueType.UINT64, GGUFValueType.INT64)}
_VT_STRING = int(GGUFValueType.STRING)
_VT_ARRAY = int(GGUFValueType.ARRAY)
_VT_BOOL = int(GGUFValueType.BOOL)

# numpy dtype of the non-quantized tensor types (BF16 has none in numpy: raw uint16 bits)
_TENSOR_DTYPE = {
    0: np.dtype("<f4"),   # F32
    1: np.dtype("<f2"),   # F16
    24: np.dtype("i1"),   # I8
    25: np.dtype("<i2"),  # I16
    26: np.dtype("<i4"),  # I32
    27: np.dtype("<i8"),  # I64
    28: np.dtype("<f8"),  # F64
    30: np.dtype("<u2"),  # BF16
}


def _value_type_name(vt: int) -> str:
    try:
        return GGUFValueType(vt).name
    except ValueError:
        return f"#{vt}"


def ggml_type_name(type_id: int) -> str:
    """Name of a ggml type id, also for types llmrt does not support ("IQ2_XXS"), or "#id"."""
    tt = _core.type_traits(type_id) if 0 <= type_id < 2**31 else None
    if tt is not None and not tt[0].startswith("WQ_"):
        return tt[0]
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"#{type_id}"


def _sniff(head: bytes) -> str:
    """What a file that is not GGUF looks like, from its first bytes ('' if unknown)."""
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (a PyTorch .pt/.bin checkpoint or a .zip?)"
    if len(head) >= 10 and head[8:10] in (b'{"', b"{'") :
        return "a safetensors file (convert it to GGUF with llama.cpp's convert_hf_to_gguf.py)"
    if head[:4] in (b"lmgg", b"fmgg", b"tjgg", b"algg"):
        return "a legacy GGML/GGJT model (pre-GGUF; re-convert it to GGUF)"
    if head.startswith(b"FUGG"):
        return "GGUF with a byte-swapped magic"
    if head[:2] == b"\x80\x02" or head[:2] == b"\x80\x04" or head[:2] == b"\x80\x05":
        return "a Python pickle (a PyTorch checkpoint?)"
    if head.startswith(b"\x1f\x8b"):
        return "a gzip archive"
    if head.startswith(b"\x93NUMPY"):
        return "a numpy .npy file"
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer, not the model itself (run `git lfs pull`)"
    stripped = head.lstrip().lower()
    if stripped.startswith((b"<!doctype", b"<html", b"<?xml")):
        return "an HTML/XML page (a failed download?)"
    if stripped.startswith((b"{", b"[")):
        return "a JSON file"
    return ""


class TensorInfo:
    """One tensor of a GGUF file.

    shape      ggml order: shape[0] = ne0 = length of a contiguous row, shape[1] = rows, ...
    type       ggml type id (int); type_name e.g. "Q4_K"
    offset     absolute byte offset of the data in the file; nbytes its size
    data       read-only numpy view into the map (see GGUFFile docstring for dtypes and shapes)
    """
    __slots__ = ("name", "shape", "type", "type_name", "offset", "nbytes", "n_elements",
                 "_file")

    def __init__(self, name, shape, type_id, type_name, offset, nbytes, n_elements, file):
        self.name = name
        self.shape = shape            # tuple of ints, ggml order
        self.type = type_id
        self.type_name = type_name
        self.offset = offset
        self.nbytes = nbytes
        self.n_elements = n_elements
        self._file = file

    @property
    def data(self) -> np.ndarray:
        return self._file._tensor_view(self)

    @property
    def is_quantized(self) -> bool:
        return self.type not in _TENSOR_DTYPE

    def __repr__(self):
        return (f"TensorInfo({self.name!r}, shape={self.shape}, type={self.type_name}, "
                f"offset={self.offset}, nbytes={self.nbytes})")


class _Reader:
    """Bounds-checked little-endian reads from the map. Every error names the path and offset."""

    def __init__(self, path: str, mm, size: int):
        self.path = path
        self.mm = mm
        self.size = size
        self.off = 0

    def fail(self, msg: str, off: int | None = None) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: {msg} (at byte offset "
                                f"{self.off if off is None else off})")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.off:
            raise self.fail(f"truncated file: reading {what} needs {n} bytes but only "
                            f"{self.size - self.off} remain (file size {self.size})")

    def remaining(self) -> int:
        return self.size - self.off

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.mm, self.off)[0]
        self.off += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.mm, self.off)[0]
        self.off += 8
        return v

    def string(self, what: str) -> str:
        start = self.off
        n = self.u64(f"length of {what}")
        if n > self.size - self.off:
            raise self.fail(f"{what}: string length {n} exceeds the {self.size - self.off} "
                            f"bytes left in the file", start)
        b = self.mm[self.off:self.off + n]
        self.off += n
        # Invalid UTF-8 is kept byte-exact (a few vocabularies hold partial characters):
        # s.encode("utf-8", "surrogateescape") gives back the original bytes.
        return b.decode("utf-8", "surrogateescape")

    def scalar(self, vt: int, what: str):
        st = _SCALAR_STRUCT[vt]
        self.need(st.size, what)
        v = st.unpack_from(self.mm, self.off)[0]
        self.off += st.size
        return bool(v) if vt == _VT_BOOL else v

    def value(self, vt: int, what: str, depth: int = 0):
        if vt in _SCALAR_STRUCT:
            return self.scalar(vt, what)
        if vt == _VT_STRING:
            return self.string(what)
        if vt == _VT_ARRAY:
            return self.array(what, depth + 1)
        raise self.fail(f"{what}: unknown metadata value type {vt}", self.off - 4)

    def array(self, what: str, depth: int):
        start = self.off
        et = self.u32(f"array element type of {what}")
        count = self.u64(f"array length of {what}")
        left = self.size - self.off
        if et in _SCALAR_DTYPE:
            dt = _SCALAR_DTYPE[et]
            if count * dt.itemsize > left:
                raise self.fail(f"{what}: array of {count} {_value_type_name(et)} needs "
                                f"{count * dt.itemsize} bytes but only {left} remain", start)
            a = np.frombuffer(self.mm, dtype=dt, count=count, offset=self.off).copy()
            self.off += count * dt.itemsize
            if et == _VT_BOOL:
                return a != 0
            return a.astype(dt.newbyteorder("="), copy=False)
        if et == _VT_STRING:
            if count * 8 > left:
                raise self.fail(f"{what}: array of {count} strings needs at least {count * 8} "
                                f"bytes but only {left} remain", start)
            # hot loop (262144 tokens for Gemma): in C (cysrc/gguf.pxi), same checks and decoding
            out, off, i, code = _core.gguf_string_array(self.mm, self.off, count)
            if out is None:
                self.off = off
                if code == 1:
                    raise self.fail(f"truncated file: reading length of {what}[{i}]")
                n = _U64.unpack_from(self.mm, off)[0]
                raise self.fail(f"{what}[{i}]: string length {n} exceeds the {self.size - off - 8} "
                                f"bytes left in the file", off)
            self.off = off
            return out
        if et == _VT_ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels",
                                start)
            if count * 12 > left:
                raise self.fail(f"{what}: array of {count} arrays needs at least {count * 12} "
                                f"bytes but only {left} remain", start)
            return [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]
        raise self.fail(f"{what}: unknown array element type {et}", start)


class GGUFFile:
    """A parsed, validated, memory-mapped GGUF file.

    path, version, alignment, data_offset (absolute start of the data section), file_size
    metadata   {key: value} in file order. str -> str; integers, floats, bools -> Python
               scalars; arrays of strings -> list[str]; numeric arrays -> numpy arrays (copies,
               native byte order; bool arrays -> numpy bool); nested arrays -> lists of those.
    kv_types   {key: value type id} and for arrays (ARRAY id, element type id): what a writer
               needs to write the same keys back.
    tensors    {name: TensorInfo} in file order. TensorInfo.data is a read-only view (a
               read-only aligned copy, made once, of a tensor not 4-byte aligned in the file):
               F32 float32, F16 float16, BF16 uint16 (raw bits), I8/I16/I32/I64/F64 their dtype,
               shaped reversed(shape) (numpy order); quantized types uint8 shaped
               (*reversed(shape[1:]), row_bytes).
    """

    def __init__(self, path, *, _data: bytes | None = None):
        self.path = os.fspath(path)
        self._mm = None
        self._buf = None
        self._advised: set = set()   # tensors already given advise_willneed
        self._copies: dict = {}      # {name: aligned copy} of tensors misaligned in the file
        self.metadata: dict[str, Any] = {}
        self.kv_types: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        if _data is None:
            self._open()
        else:
            self._mm = bytes(_data)
            self.file_size = len(self._mm)
            if self.file_size == 0:
                raise ModelFormatError(f"{self.path}: empty file (0 bytes), not a GGUF model")
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> "GGUFFile":
        """Parse GGUF bytes held in memory (tests, small files); `name` stands for the path in
        messages. Tensor views point into a private copy of `data`."""
        return cls(name, _data=data)

    # ---- opening ----------------------------------------------------------------------------

    def _open(self):
        p = self.path
        if not os.path.exists(p):
            raise ModelFormatError(f"{p}: no such file")
        if os.path.isdir(p):
            raise ModelFormatError(f"{p}: is a directory, not a GGUF file")
        try:
            mode = os.stat(p).st_mode
        except OSError as e:
            raise ModelFormatError(f"{p}: cannot open: {e}") from None
        if not stat.S_ISREG(mode):      # a FIFO would block the open, /dev/zero never ends
            raise ModelFormatError(f"{p}: not a regular file (a device, FIFO or socket), not a "
                                   "GGUF model")
        try:
            with open(p, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size == 0:
                    raise ModelFormatError(f"{p}: empty file (0 bytes), not a GGUF model")
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ModelFormatError:
            raise
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{p}: cannot open: {e}") from None
        self.file_size = len(self._mm)

    # ---- parsing ----------------------------------------------------------------------------

    def _parse(self):
        r = _Reader(self.path, self._mm, self.file_size)
        head = bytes(self._mm[:64])
        if head[:4] != GGUF_MAGIC:
            like = _sniff(head)
            raise ModelFormatError(
                f"{self.path}: not a GGUF file: magic is {head[:4]!r}, expected b'GGUF'"
                + (f"; it looks like {like}" if like else "") + " (at byte offset 0)")
        r.off = 4
        version = r.u32("version")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise r.fail(f"big-endian GGUF (version {swapped}) is not supported; use a "
                             f"little-endian file", 4)
            if version == 1:
                raise r.fail("GGUF version 1 is not supported (only v2 and v3); re-convert the "
                             "model with a recent llama.cpp", 4)
            raise r.fail(f"unsupported GGUF version {version} (only v2 and v3)", 4)
        self.version = version

        n_tensors = r.u64("tensor count")
        n_kv = r.u64("metadata key/value count")
        left = r.remaining()
        if n_tensors * _MIN_TENSOR_INFO_BYTES > left:
            raise r.fail(f"tensor count {n_tensors} cannot fit in the {left} bytes left in the "
                         f"file (truncated or corrupt file)", 8)
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > left:
            raise r.fail(f"metadata key/value count {n_kv} cannot fit in the {left} bytes left "
                         f"in the file (truncated or corrupt file)", 16)

        # ---- metadata
        for i in range(n_kv):
            kv_off = r.off
            key = r.string(f"metadata key #{i}")
            if key in self.metadata:
                raise r.fail(f"duplicate metadata key {key!r}", kv_off)
            vt_off = r.off
            vt = r.u32(f"value type of metadata key {key!r}")
            if vt == _VT_ARRAY:
                et = _U32.unpack_from(self._mm, r.off)[0] if r.remaining() >= 4 else None
                self.kv_types[key] = (vt, et)
            elif vt in _SCALAR_STRUCT or vt == _VT_STRING:
                self.kv_types[key] = vt
            else:
                raise r.fail(f"metadata key {key!r}: unknown value type {vt}", vt_off)
            self.metadata[key] = r.value(vt, f"metadata key {key!r}")

        # ---- alignment
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            a = self.metadata["general.alignment"]
            if self.kv_types["general.alignment"] not in _INT_VALUE_TYPES:
                raise ModelFormatError(f"{self.path}: general.alignment must be an integer, got "
                                       f"{a!r}")
            if a <= 0 or (a & (a - 1)) != 0:
                raise ModelFormatError(f"{self.path}: general.alignment = {a} is not a power "
                                       f"of two")
            self.alignment = int(a)

        # ---- tensor infos
        infos = []   # (name, shape, type_id, rel_offset, info_off)
        names = set()
        for i in range(n_tensors):
            info_off = r.off
            name = r.string(f"name of tensor #{i}")
            if name in names:
                raise r.fail(f"duplicate tensor name {name!r}", info_off)
            names.add(name)
            nd_off = r.off
            n_dims = r.u32(f"n_dims of tensor {name!r}")
            if n_dims < 1 or n_dims > GGML_MAX_DIMS:
                raise r.fail(f"tensor {name!r}: n_dims = {n_dims}, expected 1..{GGML_MAX_DIMS}",
                             nd_off)
            shape = []
            n_el = 1
            for d in range(n_dims):
                ne_off = r.off
                ne = r.u64(f"ne[{d}] of tensor {name!r}")
                if ne == 0 or ne > INT64_MAX:
                    raise r.fail(f"tensor {name!r}: dimension ne[{d}] = "
                                 f"{ne if ne <= INT64_MAX else ne - (1 << 64)} is not positive",
                                 ne_off)
                n_el *= ne
                if n_el > INT64_MAX:
                    raise r.fail(f"tensor {name!r}: element count overflows int64 "
                                 f"(shape {shape + [ne]})", ne_off)
                shape.append(ne)
            type_off = r.off
            type_id = r.u32(f"type of tensor {name!r}")
            tt = _core.type_traits(type_id) if type_id < 2**31 else None
            if tt is not None and tt[0].startswith("WQ_"):   # llmrt-private ids: memory only
                tt = None
            if tt is None:
                raise r.fail(f"tensor {name!r}: type {ggml_type_name(type_id)} (id {type_id}) "
                             f"is not supported by llmrt", type_off)
            tname, blck, tsize = tt[0], tt[1], tt[2]
            if shape[0] % blck != 0:
                raise r.fail(f"tensor {name!r}: row length ne[0] = {shape[0]} is not a multiple "
                             f"of the {tname} block size {blck}", info_off)
            rel_off_pos = r.off
            rel = r.u64(f"data offset of tensor {name!r}")
            if rel % self.alignment != 0:
                raise r.fail(f"tensor {name!r}: data offset {rel} is not a multiple of the "
                             f"alignment {self.alignment}", rel_off_pos)
            nbytes = n_el // blck * tsize
            infos.append((name, tuple(shape), type_id, tname, rel, nbytes, n_el, rel_off_pos))

        # ---- data section
        self.data_offset = -(-r.off // self.alignment) * self.alignment
        if infos and self.data_offset > self.file_size:
            raise ModelFormatError(f"{self.path}: truncated file: data section would start at "
                                   f"byte {self.data_offset}, beyond the end of the file "
                                   f"({self.file_size} bytes)")
        spans = []
        for name, shape, type_id, tname, rel, nbytes, n_el, pos in infos:
            start = self.data_offset + rel
            if start + nbytes > self.file_size:
                raise ModelFormatError(
                    f"{self.path}: tensor {name!r}: data [{start}, {start + nbytes}) is out of "
                    f"bounds: the file has {self.file_size} bytes (truncated download?) "
                    f"(offset field at byte offset {pos})")
            spans.append((start, start + nbytes, name))
            self.tensors[name] = TensorInfo(name, shape, type_id, tname, start, nbytes, n_el, self)
        spans.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise ModelFormatError(f"{self.path}: tensors {n0!r} [{s0}, {e0}) and {n1!r} "
                                       f"[{s1}, {e1}) overlap")
        self._buf = np.frombuffer(self._mm, dtype=np.uint8)   # base of every tensor view

    # ---- access -----------------------------------------------------------------------------

    def _tensor_view(self, t: TensorInfo) -> np.ndarray:
        if self._buf is None:
            raise ValueError(f"{self.path}: GGUF file is closed")
        raw = self._buf[t.offset:t.offset + t.nbytes]
        if raw.ctypes.data % 4:
            raw = self._aligned_copy(t, raw)
        dt = _TENSOR_DTYPE.get(t.type)
        if dt is not None:
            return raw.view(dt).reshape(t.shape[::-1])
        row_bytes = t.nbytes // (t.n_elements // t.shape[0])
        return raw.reshape(*t.shape[:0:-1], row_bytes)

    def _aligned_copy(self, t: TensorInfo, raw: np.ndarray) -> np.ndarray:
        """Tensor t's bytes copied to aligned memory, once: a file written with general.alignment
        1 or 2 (legal GGUF, loaded by llama.cpp) can place tensors where the kernels' f32 / f16 /
        block loads would be misaligned."""
        c = self._copies.get(t.name)
        if c is None:
            if not self._copies:
                log.warning("%s: tensors are not 4-byte aligned in the file (general.alignment %d): "
                            "each one used is copied into memory", self.path, self.alignment)
            c = self._copies[t.name] = raw.copy()
            c.flags.writeable = False
        return c

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        a = self.metadata.get("general.architecture", "")
        return a if isinstance(a, str) else ""

    def arch_get(self, suffix: str, default=None):
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def __getitem__(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors.values())

    def advise_willneed(self, t: TensorInfo) -> None:
        """Ask the kernel to read tensor t's pages ahead (madvise WILLNEED), once per tensor: a
        table read only at run time (the token embedding) then does not fault a page in from disk
        per new token."""
        mm = self._mm
        if mm is None or not hasattr(mm, "madvise") or t.nbytes <= 0 or t.name in self._advised:
            return
        self._advised.add(t.name)
        start = t.offset - t.offset % mmap.PAGESIZE
        try:
            mm.madvise(mmap.MADV_WILLNEED, start, min(t.offset + t.nbytes, self.file_size) - start)
        except (OSError, ValueError, AttributeError):
            pass   # a hint only

    def close(self):
        """Drop the map. Views handed out earlier keep their pages alive until they are freed."""
        self._buf = None
        self._copies = {}
        mm, self._mm = self._mm, None
        if isinstance(mm, mmap.mmap):
            try:
                mm.close()
            except BufferError:
                pass   # numpy views still export the buffer; the map closes when they go

    @property
    def closed(self) -> bool:
        return self._mm is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"GGUFFile({self.path!r}, v{self.version}, arch={self.architecture!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")


def load_gguf(path) -> GGUFFile:
    return GGUFFile(path)


# an old Mixtral file's per-expert tensor: groups (layer, projection, expert)
SPLIT_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$")


def merged_expert_name(name: str) -> str | None:
    """blk.N.ffn_{gate,up,down}.E.weight (an old Mixtral file's per-expert tensor) -> the merged
    3-D tensor it becomes at load, blk.N.ffn_{gate,up,down}_exps.weight; None for other names."""
    m = SPLIT_EXPERT.match(name)
    return None if m is None else f"blk.{m.group(1)}.ffn_{m.group(2)}_exps.weight"


def is_expert_tensor(name: str) -> bool:
    """A MoE expert weight: merged (`blk.N.ffn_*_exps.weight`) or an old file's per-expert
    `blk.N.ffn_{gate,up,down}.E.weight` (a token reads only the experts it chose)."""
    return "_exps." in name or SPLIT_EXPERT.match(name) is not None


def expert_counts(f: GGUFFile) -> tuple:
    """(expert_count, expert_used_count) of a MoE file; (0, 0) for a dense file or malformed keys
    (those are the loader's to report)."""
    prefix = f"{f.architecture}." if f.architecture else None
    n_expert = f.get(prefix + "expert_count", 0) if prefix else 0
    n_used = f.get(prefix + "expert_used_count", 0) if prefix else 0
    if not (isinstance(n_expert, (int, np.integer)) and isinstance(n_used, (int, np.integer))
            and 0 <= n_used <= n_expert):
        return 0, 0
    return int(n_expert), int(n_used)


def decode_bytes_per_token(f: GGUFFile) -> int:
    """Bytes of the file's tensors one decoded token reads: every tensor but the embedding table
    (one row of it), plus the table when there is no output matrix (tied); an expert tensor
    counts for expert_used_count / expert_count of its bytes (a token reads only its experts)."""
    n_expert, n_used = expert_counts(f)
    total = 0
    for name, t in f.tensors.items():
        if name == "token_embd.weight" and "output.weight" in f.tensors:
            continue
        total += t.nbytes * n_used // n_expert if n_expert and is_expert_tensor(name) else t.nbytes
    return total


def describe(f: GGUFFile) -> dict:
    """Summary of a model for `llmrt info`: plain Python values, printable as is."""
    arch = f.architecture
    type_counts: dict[str, int] = {}
    n_params = 0
    n_bytes = 0
    prefix = f"{arch}." if arch else None
    n_expert, n_used = expert_counts(f)
    n_active = 0.0    # parameters read per token: the experts count used / n_expert each
    for t in f.tensors.values():
        type_counts[t.type_name] = type_counts.get(t.type_name, 0) + 1
        n_params += t.n_elements
        n_bytes += t.nbytes
        expert = n_expert and is_expert_tensor(t.name)
        n_active += t.n_elements * (n_used / n_expert if expert else 1)
    experts = None
    if n_expert:
        # the shared expert's size: its key, else the first layer that has one (as the loader)
        shared = f.get(f"{arch}.expert_shared_feed_forward_length") if arch else None
        if not is_int(shared, 1):
            gates = sorted((int(m.group(1)), name) for name in f.tensors
                           if (m := re.fullmatch(r"blk\.(\d+)\.ffn_gate_shexp\.weight", name)))
            shared = int(f.tensors[gates[0][1]].shape[1]) if gates else 0
        experts = {"count": int(n_expert), "used": int(n_used), "shared_ffn": int(shared),
                   "active_params": int(round(n_active))}
    hparams = {k[len(prefix):]: v for k, v in f.metadata.items()
               if prefix and k.startswith(prefix)}
    tokens = f.get("tokenizer.ggml.tokens")
    ftype = f.get("general.file_type")
    try:
        ftype_name = LlamaFileType(ftype).name.replace("MOSTLY_", "") if ftype is not None else None
    except ValueError:
        ftype_name = f"#{ftype}"
    return {
        "path": f.path,
        "version": f.version,
        "architecture": arch,
        "name": f.get("general.name", ""),
        "file_type": ftype_name,
        "hparams": hparams,
        "tensor_types": dict(sorted(type_counts.items(), key=lambda kv: -kv[1])),
        "n_tensors": len(f.tensors),
        "n_params": n_params,
        "experts": experts,       # None for a dense model
        "tensor_bytes": n_bytes,
        "bits_per_weight": (8.0 * n_bytes / n_params) if n_params else 0.0,
        "file_size": f.file_size,
        "n_kv": len(f.metadata),
        "tokenizer_model": f.get("tokenizer.ggml.model", ""),
        "tokenizer_pre": f.get("tokenizer.ggml.pre", ""),
        "vocab_size": len(tokens) if tokens is not None else 0,
        "chat_template": isinstance(f.get("tokenizer.chat_template"), str),
    }
