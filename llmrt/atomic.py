"""Files written whole or not at all: a temporary file next to the real one, renamed over it."""
import os
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_file(path, prefix: str = ".llmrt-", suffix: str = ".tmp"):
    """Yields the path of an empty temporary file in `path`'s directory. When the block ends it
    is renamed over `path`; when the block raises it is removed. A crash never leaves half a file
    under the real name."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
