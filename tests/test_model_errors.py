"""Bad input to Model gets a clear error (ModelFormatError / ValueError naming the problem), never a
crash: unknown architecture, missing or mis-shaped tensors, bad token ids, a full context."""
import re

import gguf
import numpy as np
import pytest

from llmrt import Model, ModelFormatError


VT = gguf.GGUFValueType


def _write(path, arch="llama", drop=(), bad_shape=None, n_vocab=32, n_embd=16, n_ff=32, n_layer=1, kv=None,
           extra=None, types=None, alignment=None):
    """A tiny llama-shaped GGUF; kv: {key ("{arch}" is replaced): (value, GGUFValueType[, sub type])}
    replaces or adds metadata (value None: the key left out); extra: {name: array}, more tensors;
    types: {name: GGMLQuantizationType}, tensors stored in that type instead of F32; alignment:
    general.alignment (the writer pads the tensors to it)."""
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    meta = {f"{arch}.block_count": (n_layer, VT.UINT32), f"{arch}.context_length": (64, VT.UINT32),
            f"{arch}.embedding_length": (n_embd, VT.UINT32), f"{arch}.feed_forward_length": (n_ff, VT.UINT32),
            f"{arch}.attention.head_count": (2, VT.UINT32), f"{arch}.attention.head_count_kv": (1, VT.UINT32),
            f"{arch}.attention.layer_norm_rms_epsilon": (1e-5, VT.FLOAT32),
            "tokenizer.ggml.model": ("no_vocab", VT.STRING), f"{arch}.vocab_size": (n_vocab, VT.UINT32)}
    for k, v in (kv or {}).items():
        meta[k.replace("{arch}", arch)] = v
    for k, v in meta.items():
        if v[0] is not None:
            w.add_key_value(k, *v)
    hd = n_embd // 2
    shapes = {"token_embd.weight": (n_vocab, n_embd), "output_norm.weight": (n_embd,),
              "output.weight": (n_vocab, n_embd)}
    for il in range(n_layer):
        b = f"blk.{il}."
        shapes.update({b + "attn_norm.weight": (n_embd,), b + "attn_q.weight": (n_embd, n_embd),
                       b + "attn_k.weight": (hd, n_embd), b + "attn_v.weight": (hd, n_embd),
                       b + "attn_output.weight": (n_embd, n_embd), b + "ffn_norm.weight": (n_embd,),
                       b + "ffn_gate.weight": (n_ff, n_embd), b + "ffn_up.weight": (n_ff, n_embd),
                       b + "ffn_down.weight": (n_embd, n_ff)})
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        if name in drop:
            continue
        if name == bad_shape:
            shape = shape[:-1] + (shape[-1] * 2,)
        _add_typed(w, name, (rng.standard_normal(shape) * 0.1).astype(np.float32), (types or {}).get(name))
    for name, a in (extra or {}).items():
        _add_typed(w, name, a, (types or {}).get(name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _add_typed(w, name, a, qt):
    """Tensor a (numpy order) as it is (qt None), or (float32) stored as type qt: quantized by
    gguf.quants, integers as themselves, Q8_1 (which gguf.quants cannot make) as zero blocks: 40
    bytes each, the size gguf-py's table has (ggml's block_q8_1 is 36: llmrt reads the tensor as
    36-byte blocks, fewer bytes than were written)."""
    T = gguf.GGMLQuantizationType
    if qt is None:
        w.add_tensor(name, a)
    elif qt in (T.I8, T.I16, T.I32):
        w.add_tensor(name, a.astype({T.I8: np.int8, T.I16: np.int16, T.I32: np.int32}[qt]), raw_dtype=qt)
    elif qt == T.Q8_1:          # 32 elements: f16 d, f16 s, 32 int8
        w.add_tensor(name, np.zeros(a.shape[:-1] + (a.shape[-1] // 32 * 40,), np.uint8), raw_dtype=qt)
    else:
        w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)


def test_valid_tiny_model_runs(tmp_path):
    m = Model(_write(tmp_path / "ok.gguf"), n_threads=1, ctx_size=16)
    assert m.tokenizer is None
    logits = m([1, 2, 3])
    assert logits.shape == (3, 32) and np.isfinite(logits).all()


def test_unknown_architecture(tmp_path):
    with pytest.raises(ModelFormatError, match=r"unsupported architecture 'mamba'.*llama.*gemma3"):
        Model(_write(tmp_path / "m.gguf", arch="mamba"))


def test_missing_tensor(tmp_path):
    with pytest.raises(ModelFormatError, match=r"missing tensor blk\.0\.ffn_up\.weight"):
        Model(_write(tmp_path / "m.gguf", drop=("blk.0.ffn_up.weight",)))


def test_wrong_tensor_shape(tmp_path):
    with pytest.raises(ModelFormatError, match=r"blk\.0\.attn_q\.weight has shape"):
        Model(_write(tmp_path / "m.gguf", bad_shape="blk.0.attn_q.weight"))


def test_missing_and_directory(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file"):
        Model(str(tmp_path / "absent.gguf"))
    with pytest.raises(ModelFormatError, match="directory"):
        Model(str(tmp_path))


def test_bad_token_ids_and_full_context(tmp_path):
    m = Model(_write(tmp_path / "ok.gguf"), n_threads=1, ctx_size=4)
    with pytest.raises(ValueError, match="token id 32 is out of range"):
        m([1, 32])
    with pytest.raises(ValueError, match="token id -1 is out of range"):
        m([-1])
    with pytest.raises(ValueError, match="no tokens"):
        m([])
    sess = m.new_session(n_keep=0, kv_mode="none")   # strict cache (default: streaming)
    sess.eval([1, 2, 3])
    with pytest.raises(ValueError, match="context full"):
        sess.eval([4, 5])
    assert sess.n_past == 3          # nothing was half-evaluated
    sess.eval([4])
    assert sess.n_past == 4


def test_bad_settings(tmp_path):
    path = _write(tmp_path / "ok.gguf")
    with pytest.raises(ValueError, match="ctx_size"):
        Model(path, ctx_size=0)
    with pytest.raises(ValueError, match="kv_dtype"):
        Model(path, kv_dtype="q4")


QT = gguf.GGMLQuantizationType
# Tensors of a type or shape an op refuses: found at load by Model._check_graph (the forward pass
# built once on a graph that is never run), named in the error, not an error at the first eval.
BAD_TENSORS = [
    ({"types": {"blk.0.attn_norm.weight": QT.Q4_0}},
     r"\[mul\] a weight b must be F32, F16 or BF16, got Q4_0 \(blk\.0\.attn_norm\.weight\)"),
    ({"types": {"output_norm.weight": QT.Q8_0}}, r"got Q8_0 \(output_norm\.weight\)"),
    ({"types": {"blk.0.attn_q.weight": QT.Q8_1}},
     r"\[mul_mat\] no vec_dot kernel for Q8_1 \(blk\.0\.attn_q\.weight\) weights"),
    ({"types": {"blk.0.attn_q.weight": QT.I8}}, r"tensor blk\.0\.attn_q\.weight has type I8"),
    ({"types": {"token_embd.weight": QT.I32}}, r"tensor token_embd\.weight has type I32"),
    ({"extra": {"blk.0.attn_q.bias": np.zeros(7, np.float32)}},
     r"\[add\] b\.ne0 \(7\) must be 1 or a\.ne0 \(32\) \(b: Tensor\(weight blk\.0\.attn_q\.bias, F32"),
    ({"extra": {"blk.0.attn_k.bias": np.zeros((2, 16), np.float32)}}, r"b\.ne1 \(2\) must be 1.*blk\.0\.attn_k\.bias"),
    ({"extra": {"blk.0.attn_q.bias": np.zeros(32, np.float32)}, "types": {"blk.0.attn_q.bias": QT.Q8_0}},
     r"got Q8_0 \(blk\.0\.attn_q\.bias\)"),
    ({"extra": {"rope_freqs.weight": np.ones(1, np.float32)}},
     r"\[rope\] freq_factors must be an F32 weight of >= n_rot/2 \(8\) values, got Tensor\(weight rope_freqs\.weight"),
]


@pytest.mark.parametrize("edit,match", BAD_TENSORS)
def test_bad_tensor_is_a_load_error_naming_it(tmp_path, edit, match):
    path = _write(tmp_path / "m.gguf", n_embd=32, **edit)
    with pytest.raises(ModelFormatError, match=match):
        Model(path, n_threads=1, ctx_size=16)


def test_optional_tensors_of_the_right_type_load_and_run(tmp_path):
    """The load-time check refuses only what the ops refuse: F16 norms, Q4_0 embeddings and
    matmuls, biases and rope_freqs of the right shape load and give finite logits."""
    path = _write(tmp_path / "m.gguf", n_embd=32,
                  extra={"blk.0.attn_q.bias": np.zeros(32, np.float32), "rope_freqs.weight": np.ones(8, np.float32)},
                  types={"blk.0.attn_norm.weight": QT.F16, "token_embd.weight": QT.Q4_0,
                         "blk.0.attn_q.weight": QT.Q4_0})
    logits = Model(path, n_threads=1, ctx_size=16)([1, 2, 3])
    assert logits.shape == (3, 32) and np.isfinite(logits).all()


@pytest.mark.parametrize("alignment", [1, 2])
def test_misaligned_tensors_are_copied_and_run(tmp_path, alignment):
    """general.alignment 1 or 2 is legal GGUF (llama.cpp loads it): tensors the kernels would
    read misaligned are copied to aligned memory at first use, and the logits are the bits of
    the same model written with the default alignment."""
    types = {"blk.0.attn_q.weight": QT.Q4_0, "blk.0.attn_k.weight": QT.F16}
    ref = Model(_write(tmp_path / "a32.gguf", n_embd=32, types=types), n_threads=1, ctx_size=16)([1, 2, 3])
    odd = {"general.name": ("t", VT.STRING)}   # a header of 4k + 1 bytes: the data section starts there
    m = Model(_write(tmp_path / "a.gguf", n_embd=32, types=types, alignment=alignment, kv=odd), n_threads=1,
              ctx_size=16)
    misaligned = {n for n, t in m.gguf.tensors.items() if t.offset % 4}
    assert misaligned
    np.testing.assert_array_equal(m([1, 2, 3]), ref)
    assert set(m.gguf._copies) == misaligned
    assert all(t.data.ctypes.data % 4 == 0 for t in m.gguf.tensors.values())


# Metadata a fuzzer of GGUF files turned into exceptions from deep inside (MemoryError,
# ZeroDivisionError, OverflowError, IndexError, numpy's ValueError) before they were checked.
BAD_KV = [
    ({"{arch}.block_count": (2**31 - 1, VT.UINT32)}, r"block_count is 2147483647 but the file has tensors of 1 block"),
    ({"{arch}.block_count": (2**32 - 1, VT.UINT32)}, r"block_count is too large"),
    ({"{arch}.attention.key_length": (0, VT.UINT32)}, r"head size must be > 0"),
    ({"{arch}.attention.head_count": (32, VT.UINT32)}, r"head size must be > 0"),   # embedding 16 // 32 heads
    ({"{arch}.block_count": (float("inf"), VT.FLOAT32)}, r"block_count must be an integer, got inf \(float\)"),
    # a count of another GGUF type was coerced (1.5 -> 1, True -> 1, "16" -> 16): llama.cpp checks types
    ({"{arch}.context_length": (1.5, VT.FLOAT32)}, r"context_length must be an integer, got 1.5 \(float\)"),
    ({"{arch}.block_count": (True, VT.BOOL)}, r"block_count must be an integer, got True \(bool\)"),
    ({"{arch}.embedding_length": ("16", VT.STRING)}, r"embedding_length must be an integer, got '16' \(str\)"),
    ({"{arch}.attention.head_count": (["4", "4"], VT.ARRAY, VT.STRING)}, r"head_count must be an integer, got '4'"),
    ({"{arch}.rope.freq_base": ("1e4", VT.STRING)}, r"rope.freq_base must be a number, got '1e4' \(str\)"),
    ({"{arch}.attention.head_count": ([[1, 2], [3]], VT.ARRAY, VT.ARRAY)}, r"head_count is not a number or an array"),
    ({"{arch}.context_length": (2**32 - 1, VT.UINT32)}, r"context_length is too large"),
    ({"{arch}.rope.scaling.original_context_length": (2**32, VT.UINT64)}, r"original_context_length is too large"),
    ({"tokenizer.ggml.tokens": (5, VT.UINT32), "{arch}.vocab_size": (None,)}, r"tokenizer.ggml.tokens must be an array"),
    ({"tokenizer.ggml.tokens": ([f"t{i}" for i in range(20)], VT.ARRAY, VT.STRING)},
     r"the vocabulary has 20 tokens but the model 32"),             # ids it could not decode
    ({"{arch}.rope.dimension_count": (0, VT.UINT32)}, r"rope.dimension_count \(0\) must be even, > 0"),
    ({"{arch}.rope.freq_base": (0.0, VT.FLOAT32)}, r"rope.freq_base must be > 0"),
    ({"{arch}.rope.scaling.factor": (3e38, VT.FLOAT32)}, r"rope.scaling.factor .* is out of range"),
    ({"{arch}.rope.scaling.factor": (-2.0, VT.FLOAT32)}, r"rope.scaling.factor must be > 0 \(or 0: none\), got -2.0"),
    ({"{arch}.rope.scaling.type": (["yarn"], VT.ARRAY, VT.STRING)}, r"rope.scaling.type must be a string"),
    ({"{arch}.attention.layer_norm_rms_epsilon": (-1.0, VT.FLOAT32)}, r"layer_norm_rms_epsilon must be >= 0"),
]


def test_block_count_needs_every_block(tmp_path):
    """One far-numbered tensor does not make a huge block_count plausible (the tensor list it
    sizes is not built: a MemoryError after half a minute before)."""
    path = _write(tmp_path / "m.gguf", kv={"{arch}.block_count": (10**8, VT.UINT32)},
                  extra={"blk.99999999.x.weight": np.zeros(1, np.float32)})
    with pytest.raises(ModelFormatError, match=r"block_count is 100000000 but the file has tensors of 2 blocks"):
        Model(path, n_threads=1, ctx_size=16)


def test_a_block_past_block_count_is_an_error(tmp_path):
    """block_count smaller than the file's blocks ran fewer layers (the last ones' tensors unused)."""
    path = _write(tmp_path / "m.gguf", extra={"blk.1.attn_norm.weight": np.ones(16, np.float32)})
    with pytest.raises(ModelFormatError, match=r"tensor blk.1.attn_norm.weight belongs to block 1, "
                                               r"but llama.block_count is 1"):
        Model(path, n_threads=1, ctx_size=16)


@pytest.mark.parametrize("kv,msg", BAD_KV, ids=range(len(BAD_KV)))
def test_bad_metadata_is_a_clear_error(tmp_path, kv, msg):
    with pytest.raises(ModelFormatError, match=msg):
        Model(_write(tmp_path / "m.gguf", kv=kv), n_threads=1, ctx_size=16)


def test_bad_tokenizer_metadata_is_a_clear_error():
    """Tokenizer.from_gguf on malformed vocabulary keys (wrong types, lengths, bytes)."""
    from llmrt.tokenizer import Tokenizer
    toks = ["<unk>", "<s>", "</s>"] + [chr(ord("a") + i) for i in range(26)]
    n = len(toks)
    base = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.scores": [0.0] * n, "tokenizer.ggml.token_type": [2, 3, 3] + [1] * 26}
    assert Tokenizer.from_gguf(base).n_vocab == n                   # the valid one loads
    cases = [({"tokenizer.ggml.model": ["llama"]}, r"tokenizer.ggml.model must be a string"),
             ({"tokenizer.ggml.tokens": 7}, r"tokenizer.ggml.tokens must be an array"),
             ({"tokenizer.ggml.scores": ["x"] * n}, r"scores must be an array of numbers"),
             ({"tokenizer.ggml.scores": [0.0] * (n - 1)}, r"scores must have one value per token"),
             ({"tokenizer.ggml.token_type": 5}, r"token_type must be an array"),
             ({"tokenizer.ggml.token_type": [2**64 - 1] * n}, r"token_type has values outside"),
             ({"tokenizer.ggml.bos_token_id": "abc"}, r"bos_token_id must be an integer"),
             ({"tokenizer.ggml.tokens": toks[:-1] + [b"\xe2\x96".decode("utf-8", "surrogateescape")]},
              r"token 28 is not valid UTF-8"),
             ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": 1.0}, r"merges must be an array"),
             ({"tokenizer.ggml.tokens": toks[:-1] + ["a\x00b"]}, r"sentencepiece rejects this vocabulary")]
    for change, msg in cases:
        with pytest.raises(ModelFormatError, match=msg):
            Tokenizer.from_gguf({**base, **change})
    # an array where a string is expected is ignored as llama.cpp ignores a key of the wrong type
    assert Tokenizer.from_gguf({**base, "general.name": ["a", "b"]}).n_vocab == n


@pytest.mark.parametrize("kw, msg", [
    (dict(extra={"blk.1.attn_norm.weight": np.ones(16, np.float32)}), r"belongs to block 1, but llama.block_count is 1"),
    (dict(kv={"{arch}.attention.head_count": (2.0, VT.FLOAT32)}), r"head_count must be an integer, got 2.0"),
    (dict(drop=("blk.0.ffn_down.weight",)), r"missing tensor blk.0.ffn_down.weight"),
], ids=["block-past-count", "float-count", "missing-tensor"])
def test_quantize_refuses_what_the_loader_refuses(tmp_path, kw, msg):
    """`llmrt quantize` wrote outputs for broken inputs (a float head count made it print
    "invalid literal for int()"; others gave files that then failed at load): now IN is checked
    as the loader checks it, before anything is written."""
    from click.testing import CliRunner

    from llmrt.cli import main
    path = _write(tmp_path / "m.gguf", **kw)
    with pytest.raises(ModelFormatError, match=msg):
        Model(path, n_threads=1, ctx_size=16)
    out = tmp_path / "q.gguf"
    r = CliRunner().invoke(main, ["quantize", str(path), str(out), "q8_0"], env={"LLMRT_PROGRESS": "0"})
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1
    assert re.search(msg, r.stderr) and not out.exists()


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path):
    """`llmrt info FIFO` blocked forever in open(); /dev/zero was called "empty file (0 bytes)"."""
    import os
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in (str(fifo), "/dev/zero"):
        with pytest.raises(ModelFormatError, match="not a regular file"):
            Model(p, n_threads=1, ctx_size=16)
