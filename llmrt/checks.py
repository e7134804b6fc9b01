"""Checks of values that come from users and files, shared by the API, the loaders and the
session / chat file readers (no imports from the rest of llmrt, so anything can import it)."""
import re

import numpy as np

C_INT_MAX = 2**31 - 1   # sizes, counts, positions and context lengths end up in C ints
_ID_TEXT = re.compile(r"\s*([0-9]+)\s*", re.ASCII)


def is_int(v, lo=None, hi=None) -> bool:
    """v is an integer (Python or numpy; not a bool, not 32.0) within [lo, hi] (None: open)."""
    return (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            and (lo is None or v >= lo) and (hi is None or v <= hi))


def id_text(v):
    """A token id written as text (a JSON object's key: ASCII digits, spaces around) -> its int,
    else None. Past 30 digits C_INT_MAX + 1 (out of any vocabulary), not a 4000-digit int."""
    m = _ID_TEXT.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        return None
    return int(m.group(1)) if len(m.group(1)) <= 30 else C_INT_MAX + 1


def is_number(v) -> bool:
    """v is a real number (Python or numpy int or float; not a bool, not a str)."""
    return (isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, (bool, np.bool_)))


def decode_utf8(data: bytes, what: str) -> str:
    """`data` as UTF-8 text; else a ValueError naming `what` (a file, a command-line option, a
    line of stdin) and the first bad byte and its offset, not the codec's bare message."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start})") from None


def read_utf8(path) -> str:
    """The text of the file `path` (decode_utf8)."""
    with open(path, "rb") as f:
        return decode_utf8(f.read(), str(path))


def id_array(ids: np.ndarray) -> np.ndarray:
    """A numpy array of token ids as one 1-D integer sequence (a batch of one, shape (1, n), is
    accepted); ValueError for another shape, TypeError for a non-integer dtype."""
    arr = ids[0] if ids.ndim == 2 and ids.shape[0] == 1 else ids
    if arr.ndim != 1:
        raise ValueError(f"token ids must be one sequence (1-D), got an array of shape {ids.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, got an array of {arr.dtype}")
    return arr


def id_list(ids) -> list[int]:
    """Token ids from a list, a tuple, a numpy array or a torch-like tensor (a batch of one,
    [[...]] or shape (1, n), is accepted). TypeError for text, bytes, unordered collections
    (a set, a dict), floats and nested sequences of more than one row."""
    if isinstance(ids, (str, bytes, bytearray)):
        raise TypeError(f"token ids must be a sequence of ints, got {type(ids).__name__} "
                        "(pass text as a str prompt where one is accepted)")
    if isinstance(ids, (set, frozenset, dict)):
        raise TypeError(f"token ids must be an ordered sequence of ints, got {type(ids).__name__}")
    if isinstance(ids, np.ndarray):
        return id_array(ids).tolist()
    if hasattr(ids, "tolist") and not isinstance(ids, list):
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)):
        try:
            ids = list(ids)
        except TypeError:
            raise TypeError(f"token ids must be a sequence of ints, got {type(ids).__name__}") from None
    if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    out = []
    for i in ids:
        if not is_int(i):
            what = "a nested sequence (one sequence of ids is evaluated at a time)" \
                if isinstance(i, (list, tuple, np.ndarray)) else f"{i!r} ({type(i).__name__})"
            raise TypeError(f"token ids must be ints, got {what}")
        out.append(int(i))
    return out
