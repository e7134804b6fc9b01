# GGUF helpers (llmrt/gguf.py): the one hot loop of parsing a GGUF header, arrays of strings
# (Gemma's vocabulary is 262144 of them), run in C instead of the interpreter.
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy as _gguf_memcpy
from libc.stdint cimport uint64_t


def gguf_string_array(const unsigned char[::1] buf, Py_ssize_t off, Py_ssize_t count):
    """Decodes `count` GGUF strings (u64 little-endian length, then that many UTF-8 bytes) from
    buf[off:]. Invalid UTF-8 is kept byte-exact (errors="surrogateescape"), as gguf.py does.

    Returns (strings, end, -1, 0) when all are read, else (None, where, i, code) for the first
    bad string i, where = the offset of its length field: code 1 = fewer than 8 bytes left for
    the length, code 2 = the length exceeds the bytes left after it."""
    cdef Py_ssize_t size = buf.shape[0]
    cdef Py_ssize_t i
    cdef uint64_t n
    cdef list out = []
    if count <= 0:
        return out, off, -1, 0
    if off < 0 or off >= size:
        return None, off, 0, 1
    cdef const unsigned char *base = &buf[0]
    for i in range(count):
        if size - off < 8:
            return None, off, i, 1
        _gguf_memcpy(&n, base + off, 8)          # x86-64 and the other targets: little-endian
        if n > <uint64_t>(size - off - 8):
            return None, off, i, 2
        off += 8
        out.append(PyUnicode_DecodeUTF8(<const char *>(base + off), <Py_ssize_t>n, "surrogateescape"))
        off += <Py_ssize_t>n
    return out, off, -1, 0
