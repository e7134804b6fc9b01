"""Files written whole or not at all: a temporary file next to the real one, renamed over it."""
import os
import stat
import tempfile
from contextlib import contextmanager
from typing import Optional


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:       # Linux: read it without changing it
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def target_path(path) -> str:
    """The file that writing `path` replaces: a str or os.PathLike (bytes decoded as the file
    system does), symlinks followed (the link is kept, the file it names is replaced). TypeError
    for anything else; ValueError if it exists and is not a regular file (a device such as
    /dev/null, a fifo, a directory): renaming over it would destroy it, so it is refused."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"a file path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fsdecode(os.fspath(path))
    if not path:
        raise ValueError("the file path is empty")
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} exists and is not a regular file: refusing to replace it")
    return real


def writable_target(path) -> str:
    """target_path(path), checked before any work that ends in writing it: its directory exists
    and is writable (ValueError naming the path otherwise)."""
    real = target_path(path)
    d = os.path.dirname(real)
    if not os.path.isdir(d):
        raise ValueError(f"{path}: no such directory {d}")
    if not os.access(d, os.W_OK):
        raise ValueError(f"{path}: the directory {d} is not writable")
    return real


@contextmanager
def atomic_file(path, prefix: Optional[str] = None, suffix: str = ".tmp"):
    """Yields the path of an empty temporary file in the directory of the file `path` names
    (target_path; prefix None: "." + its name + "."). When the block ends it is renamed over that
    file, with the mode the file had (a new file: 0666 less the umask); when the block raises it
    is removed. A crash never leaves half a file under the real name."""
    real = target_path(path)
    if prefix is None:
        prefix = "." + os.path.basename(real) + "."
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=os.path.dirname(real))
    except OSError:                 # name the file asked for, not the temporary's random name
        writable_target(path)       # (no such directory / not writable: a ValueError)
        raise
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
