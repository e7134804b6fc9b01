"""Sessions that survive restarts (llmrt/sessionfile.py, KVCache.state / load_state in
csrc/kv_cache.c): a generation or a conversation saved to a file and restored in another Model
object goes on exactly as the uninterrupted one (greedy and seeded sampling: the same ids),
across shifts of the streaming cache; bad files are clear errors and change nothing; writes are
atomic; the CLI's --session, /save and /load.

Models: tiny random Hugging Face models written to GGUF (tests/hf_gguf.py).

Run: python -m pytest -q tests/test_sessions.py
"""
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is a test extra (pip install -e .[test])")
pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e .[test])")

from hf_gguf import tiny_model, write_gguf  # noqa: E402

from llmrt import ChatSession, Model, Session, _core  # noqa: E402
from llmrt.generation import decode  # noqa: E402
from llmrt.sampling import Sampler  # noqa: E402
from llmrt.sessionfile import SessionFileError, load_into  # noqa: E402

N_VOCAB_IDS = 250


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    out = {}
    for name, fam, seed in (("llama", "llama", 0), ("llama2", "llama", 1), ("gemma3", "gemma3", 0)):
        model, config = tiny_model(fam, seed=seed)
        out[name] = str(write_gguf(model, config, tmp_path_factory.mktemp(name) / "f32.gguf", dtype="f32"))
    return out


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, N_VOCAB_IDS, size=n).tolist()


def _greedy(sess, logits, n):
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = sess.eval([t])
    return out


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("kv_mode", ["shift", "recompute", "none"])
def test_cache_state_roundtrip_is_exact(paths, kv_dtype, kv_mode):
    """A cache with holes (evictions) saved and loaded: the same cells, so the same logits."""
    m = Model(paths["llama"], n_threads=2, kv_dtype=kv_dtype)
    kw = dict(ctx_size=48, n_keep=3, n_discard=7, kv_mode=kv_mode)
    a = m.new_session(**kw)
    a.eval(_ids(40 if kv_mode == "none" else 90, 1))
    assert kv_mode == "none" or a.n_shifts > 0
    b = m.new_session(**kw)
    b.cache.load_state(a.cache.state())
    b.tokens = list(a.tokens)
    np.testing.assert_array_equal(b.cache.positions(), a.cache.positions())
    for t in range(5 if kv_mode == "none" else 30):    # and on through further evictions
        np.testing.assert_array_equal(b.eval([7 + t]), a.eval([7 + t]))


def test_cache_load_state_refuses_what_does_not_fit(paths):
    m = Model(paths["llama"], n_threads=2)
    a = m.new_session(ctx_size=32)
    a.eval(_ids(20, 2))
    img = a.cache.state()
    b = m.new_session(ctx_size=32)
    b.eval(_ids(5, 3))
    before = b.cache.state()
    for bad in (img[:-4], img + b"\0\0\0\0", b"x" * len(img), img[:10], b""):
        with pytest.raises(ValueError, match="does not fit"):
            b.cache.load_state(bad)
        assert b.cache.state() == before                # unchanged
    # a damaged token order (a cell twice) and a damaged live mark
    hdr = 4 * 8 + m.hparams.n_layer * 12
    n_phys = a.cache.n_used
    broken = bytearray(img)
    broken[hdr + 4 * n_phys: hdr + 4 * n_phys + 8] = bytes(broken[hdr + 4 * n_phys: hdr + 4 * n_phys + 4]) * 2
    with pytest.raises(ValueError):
        b.cache.load_state(bytes(broken))
    broken = bytearray(img)
    broken[hdr + 8 * n_phys] = 7
    with pytest.raises(ValueError):
        b.cache.load_state(bytes(broken))
    assert b.cache.state() == before
    for other in (m.new_session(ctx_size=33), m.new_session(ctx_size=32, kv_mode="recompute"),
                  Model(paths["llama"], n_threads=2, kv_dtype="f32").new_session(ctx_size=32)):
        with pytest.raises(ValueError, match="does not fit"):
            other.cache.load_state(img)
    hp = m.hparams
    shapes = hp.kv_shapes()
    c = _core.KVCache(hp.n_layer, 32, [s[0] for s in shapes], [s[1] for s in shapes],
                      [s[2] + 0 for s in shapes], dtype="f16")     # no shift: another image kind
    with pytest.raises(ValueError, match="does not fit"):
        c.load_state(img)


def test_generation_state_survives_a_restart(paths, tmp_path):
    """Session.save mid-generation with a seeded sampler; Session.load in another Model object
    continues with exactly the ids the uninterrupted generation gives."""
    tok = Model(paths["llama"], n_threads=2).tokenizer
    prompt = _ids(30, 4)

    def run(m, split=None):
        s = m.new_session(ctx_size=40, n_keep=4, n_discard=9)
        smp = Sampler(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=11)
        logits = s.eval(prompt)
        first = decode(s, logits, tok, smp, list(prompt), max_new_tokens=split or 60, ignore_eos=True)
        return s, smp, first
    m1 = Model(paths["llama"], n_threads=2)
    _, _, whole = run(m1)
    s, smp, first = run(m1, split=25)
    # decode() does not feed the last sampled id: feed it, then save with the logits after it
    logits = s.eval([first.ids[-1]])
    f = tmp_path / "gen.llmrt"
    assert s.save(f, sampler=smp, last_logits=logits) == f.stat().st_size
    assert s.n_shifts > 0
    m2 = Model(paths["llama"], n_threads=2)
    r = Session.load(f, m2)
    assert r.tokens == s.tokens and r.n_shifts == s.n_shifts and r.n_keep == 4 and r.n_discard == 9
    np.testing.assert_array_equal(r.last_logits, logits)
    rest = decode(r, r.last_logits, tok, r.sampler, list(prompt) + first.ids, max_new_tokens=35,
                  ignore_eos=True)
    assert first.ids + rest.ids == whole.ids
    assert r.n_shifts > s.n_shifts                      # it went on shifting after the restart


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_chat_survives_a_restart(paths, tmp_path, family):
    turns = [_text(i) for i in range(8)]
    kw = dict(system="sys", ctx_size=200, max_new_tokens=12, temperature=0.7, seed=3,
              ignore_eos=True)
    m = Model(paths[family], n_threads=2)
    a = ChatSession(m, **kw)
    whole = [a.send(t) for t in turns]
    assert a.session.n_shifts > 0
    b = ChatSession(m, **kw)
    head = [b.send(t) for t in turns[:5]]
    f = tmp_path / "chat.llmrt"
    b.save(f)
    c = ChatSession.load(f, Model(paths[family], n_threads=2))
    assert c.messages == b.messages and c.session.tokens == b.session.tokens
    assert head + [c.send(t) for t in turns[5:]] == whole


def _text(i):
    return ["hello there", "what now", "tell me more", "and then", "ok bye"][i % 5] + f" {i}"


def test_bad_files_are_clear_errors_and_change_nothing(paths, tmp_path):
    m = Model(paths["llama"], n_threads=2)
    cs = ChatSession(m, ctx_size=64, max_new_tokens=6, temperature=0, ignore_eos=True)
    cs.send("hello")
    good = tmp_path / "good.llmrt"
    cs.save(good)
    raw = good.read_bytes()
    cases = {
        "truncated": (raw[:len(raw) // 2], "truncated"),
        "damaged": (raw[:len(raw) // 2] + bytes(b ^ 0xFF for b in raw[len(raw) // 2:len(raw) // 2 + 10])
                    + raw[len(raw) // 2 + 10:], "checksum"),
        "foreign": (b"GGUF" + os.urandom(200), "not an llmrt session file"),
        "empty": (b"", "not an llmrt session file"),
        "header": (raw[:20] + b"[" + raw[21:], "damaged session file header"),
    }
    s = m.new_session(ctx_size=64)
    s.eval(_ids(10, 5))
    before, toks = s.cache.state(), list(s.tokens)
    for name, (data, msg) in cases.items():
        p = tmp_path / f"{name}.llmrt"
        p.write_bytes(data)
        with pytest.raises(SessionFileError, match=msg):
            ChatSession.load(p, m)
        with pytest.raises(SessionFileError, match=msg):
            load_into(p, s)
        assert s.cache.state() == before and s.tokens == toks
    with pytest.raises(SessionFileError, match="another model"):
        ChatSession.load(good, Model(paths["llama2"], n_threads=2))
    with pytest.raises(SessionFileError, match="kv_dtype"):
        ChatSession.load(good, Model(paths["llama"], n_threads=2, kv_dtype="f32"))
    with pytest.raises(SessionFileError, match="64 cells"):
        load_into(good, m.new_session(ctx_size=65))
    with pytest.raises(SessionFileError, match="cannot read"):
        ChatSession.load(tmp_path / "missing.llmrt", m)
    gen = tmp_path / "gen.llmrt"
    s.save(gen)
    with pytest.raises(SessionFileError, match="not a chat"):
        ChatSession.load(gen, m)
    # the session whose load failed goes on as before
    ref = m.new_session(ctx_size=64)
    ref.eval(toks)
    np.testing.assert_array_equal(s.eval([3]), ref.eval([3]))


def _rewrite_header(raw: bytes, edit) -> bytes:
    """A session file with its JSON header changed by edit(header) (blobs and checksums kept)."""
    import json
    import struct
    magic, version, n = struct.unpack_from("<8sIQ", raw)
    h = json.loads(raw[20:20 + n])
    edit(h)
    head = json.dumps(h).encode()
    return struct.pack("<8sIQ", magic, version, len(head)) + head + raw[20 + n:]


def _set(*path_value):
    *path, value = path_value
    def edit(h):
        for k in path[:-1]:
            h = h[k]
        h[path[-1]] = value
    return edit


# The header is JSON without a checksum: fields of the wrong type or range once came out as
# KeyError, TypeError, OverflowError (n_ctx past a C int), a MemoryError, or a damaged chat that
# failed at its next turn. Each is now a SessionFileError before anything is allocated or changed.
BAD_HEADERS = [
    (_set("session", "n_ctx", 2 ** 40), "session.n_ctx"),
    (_set("session", "n_ctx", 128), r"not one of \d+ layers x 128 cells"),   # the image holds 64
    (_set("session", "n_ctx", "64"), "session.n_ctx"),
    (_set("session", "kv_mode", "teleport"), "session.kv_mode"),
    (_set("session", "tokens", "abc"), "session.tokens"),
    (_set("session", "tokens", [10 ** 9]), "session.tokens"),
    (_set("session", "n_keep", None), "session.n_keep"),
    (_set("blobs", 0, "bytes", "many"), "blobs"),
    (lambda h: h["blobs"][0].pop("name"), "blobs"),
    (_set("model", []), "model"),
    (_set("sampler", "params", "temperature", "hot"), "sampler"),
    (_set("sampler", "params", "repeat_penalty", 0), "sampler's parameters"),
    (_set("sampler", "rng", "state", "state", -1), "random state"),
    (_set("extra", "chat", "messages", [{"role": "user", "content": 5}]), "the chat's state"),
    (_set("extra", "chat", "template", "{% if %}"), "chat template"),
    (_set("extra", "chat", "hist", [-1]), "the chat's state"),
    (lambda h: h["extra"]["chat"].pop("system"), "the chat's state"),
    (_set("extra", []), "extra"),
]


@pytest.mark.parametrize("edit,msg", BAD_HEADERS)
def test_damaged_header_fields_are_clear_errors(paths, tmp_path, edit, msg):
    m = Model(paths["llama"], n_threads=2)
    cs = ChatSession(m, ctx_size=64, max_new_tokens=4, temperature=0.7, seed=1, ignore_eos=True)
    cs.send("hello")
    good = tmp_path / "good.llmrt"
    cs.save(good)
    bad = tmp_path / "bad.llmrt"
    bad.write_bytes(_rewrite_header(good.read_bytes(), edit))
    with pytest.raises(SessionFileError, match=msg):
        ChatSession.load(bad, m)
    bad.write_bytes(_rewrite_header(good.read_bytes(), lambda h: None))   # the helper itself: loads
    assert ChatSession.load(bad, m).messages == cs.messages


def test_writes_are_atomic(paths, tmp_path, monkeypatch):
    m = Model(paths["llama"], n_threads=2)
    s = m.new_session(ctx_size=32)
    s.eval(_ids(8, 6))
    f = tmp_path / "s.llmrt"
    s.save(f)
    good = f.read_bytes()
    s.eval([1, 2, 3])

    import llmrt.sessionfile as sf
    real_fsync = sf.os.fsync

    def crash(fd):
        raise OSError("disk on fire")
    monkeypatch.setattr(sf.os, "fsync", crash)
    with pytest.raises(OSError, match="disk on fire"):
        s.save(f)
    monkeypatch.setattr(sf.os, "fsync", real_fsync)
    assert f.read_bytes() == good                       # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.llmrt"]   # no temporary left


def test_saving_keeps_links_modes_and_devices(paths, tmp_path):
    """Saving renamed a temporary file over the path as it was: a symlink was replaced by a
    plain file, a file's mode reset to 0600, and (as root) /dev/null replaced by a regular file.
    Now the file a link names is replaced and the link kept, the mode carried over, and a path
    that exists and is not a regular file (a fifo here) refused with nothing changed."""
    m = Model(paths["llama"], n_threads=2)
    s = m.new_session(ctx_size=32)
    s.eval(_ids(8, 7))
    real = tmp_path / "real.llmrt"
    real.write_bytes(b"old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.llmrt"
    link.symlink_to(real)
    n = s.save(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.stat().st_size == n and (real.stat().st_mode & 0o777) == 0o640
    assert Session.load(link, m).tokens == s.tokens
    fresh = tmp_path / "new.llmrt"
    s.save(os.fsencode(str(fresh)))                     # a bytes path is a path, not "b'...'"
    umask = os.umask(0)
    os.umask(umask)
    assert (fresh.stat().st_mode & 0o777) == 0o666 & ~umask
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file: refusing to replace it"):
        s.save(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(SessionFileError, match="not a regular file"):
        Session.load(fifo, m)
    for bad in (None, 5):
        with pytest.raises(TypeError, match="must be a str or os.PathLike"):
            s.save(bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.llmrt", "new.llmrt", "real.llmrt"]


def test_loading_reads_the_header_before_the_rest(paths, tmp_path):
    """A large file that is not a session file was read whole before its first bytes were
    checked (/dev/zero: until memory ran out)."""
    m = Model(paths["llama"], n_threads=2)
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(1 << 40)                             # 1 TiB, sparse: only its start is read
    with pytest.raises(SessionFileError, match="not an llmrt session file"):
        Session.load(big, m)
    s = m.new_session(ctx_size=32)
    s.eval(_ids(8, 8))
    f = tmp_path / "s.llmrt"
    s.save(f)
    with open(f, "ab") as fh:
        fh.truncate(1 << 40)                            # a valid start, then a TiB of zeros
    with pytest.raises(SessionFileError, match="damaged session file"):
        Session.load(f, m)


def test_cli_chat_session_file(paths, tmp_path):
    """llmrt chat --session: the second run continues the first; /save and /load too."""
    f = tmp_path / "cli.llmrt"
    base = [sys.executable, "-m", "llmrt", "chat", paths["llama"], "-c", "256", "--temp", "0",
            "-n", "8", "--ignore-eos", "-t", "2"]

    def run(lines, *extra):
        r = subprocess.run(base + list(extra), input="\n".join(lines) + "\n", capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r
    whole = run(["hello 1", "and then 2", "more 3"]).stdout
    first = run(["hello 1", "and then 2"], "--session", str(f))
    assert "session: saved" in first.stderr and f.is_file()
    second = run(["more 3"], "--session", str(f))
    assert "session: loaded" in second.stderr
    assert first.stdout + second.stdout == whole
    # /save after turn 1, turn 2, /load (back to after turn 1), turn 2 again, turn 3: the
    # answers are whole's 1, 2, 2, 3 (greedy)
    a1 = run(["hello 1"]).stdout
    a2 = first.stdout[len(a1):]
    a3 = whole[len(first.stdout):]
    assert first.stdout.startswith(a1) and a2 and a3
    g = tmp_path / "slash.llmrt"
    r = run(["hello 1", f"/save {g}", "and then 2", f"/load {g}", "and then 2", "more 3"])
    assert "session: saved" in r.stderr and "session: loaded" in r.stderr
    assert r.stdout == a1 + a2 + a2 + a3
    # the options of the answers to come apply to a loaded session (they were dropped): -n 3
    # gives the first 3 tokens of the greedy answer; -s cannot change the conversation: a warning
    short = run(["more 3"], "--session", str(f), "-n", "3", "-s", "You are a pirate.")
    assert "session: loaded" in short.stderr and "-s ignored" in short.stderr
    assert short.stdout.strip() and a3.startswith(short.stdout.rstrip("\n"))
    assert len(short.stdout) < len(a3)
    r = subprocess.run(base + ["--session", str(tmp_path / "no" / "such" / "dir.llmrt")], input="hi\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no such directory" in r.stderr and r.stdout == ""   # before any answer
    bad = tmp_path / "bad.llmrt"
    bad.write_bytes(b"junk")
    r = subprocess.run(base + ["--session", str(bad)], input="hi\n", capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "not an llmrt session file" in r.stderr
    assert bad.read_bytes() == b"junk"                  # nothing lost


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_cli_chat_session_is_saved_on_sigterm(paths, tmp_path, sig):
    """`kill` (SIGTERM, as systemd or a timeout sends it) or a closed terminal (SIGHUP) ended
    `llmrt chat --session` without saving the conversation (Ctrl-C saved it): now both run the
    Ctrl-C path, so the session is saved, and the exit code is 128 + the signal."""
    import signal
    import time
    f = tmp_path / "term.llmrt"
    p = subprocess.Popen([sys.executable, "-m", "llmrt", "chat", paths["llama"], "-c", "256", "--temp", "0",
                          "-n", "8", "--ignore-eos", "-t", "2", "--session", str(f)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdin.write("hello 1\n")
    p.stdin.flush()                     # stdin stays open: the chat waits for the next turn
    t0 = time.monotonic()
    while not f.exists() and time.monotonic() - t0 < 60:
        line = p.stdout.readline()      # the answer (8 tokens, then its newline)
        if line.strip():
            break
    p.send_signal(getattr(signal, sig))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + getattr(signal, sig), err
    assert f"terminated ({sig})" in err and "session: saved" in err and "Traceback" not in err
    from llmrt import Model
    from llmrt.chat import ChatSession
    cs = ChatSession.load(str(f), Model(paths["llama"], n_threads=1, ctx_size=256))
    assert [m["role"] for m in cs.messages] == ["user", "assistant"]


def test_a_chat_keeps_its_logit_bias_over_a_restart(paths, tmp_path):
    m = Model(paths["llama"], n_threads=2)
    bias = {5: float("-inf"), 7: 2.5}
    a = ChatSession(m, ctx_size=200, max_new_tokens=4, temperature=0, ignore_eos=True, logit_bias=bias)
    a.send("hello there")
    a.save(tmp_path / "chat.llmrt")
    c = ChatSession.load(tmp_path / "chat.llmrt", Model(paths["llama"], n_threads=2))
    assert c.sampler.logit_bias == a.sampler.logit_bias == bias
