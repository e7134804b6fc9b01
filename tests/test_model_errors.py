"""Bad input to Model gets a clear error (ModelFormatError / ValueError naming the problem), never a
crash: unknown architecture, missing or mis-shaped tensors, bad token ids, a full context."""
import gguf
import numpy as np
import pytest

from llmrt import Model, ModelFormatError


def _write(path, arch="llama", drop=(), bad_shape=None, n_vocab=32, n_embd=16, n_ff=32, n_layer=1):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(64)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("no_vocab")
    w.add_uint32(f"{arch}.vocab_size", n_vocab)
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
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


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
