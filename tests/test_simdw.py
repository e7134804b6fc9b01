"""The 512-bit SIMD layer (csrc/kernels/x86/simdw.h): its AVX2 emulation backend equals the real
AVX-512 instructions bit for bit (where this CPU has them) and the instructions' definitions
(numpy, everywhere): integer ops lane for lane, vpdpbusd without intermediate saturation,
vdpbf16ps as two rounded f32 adds with DAZ/FTZ, a fixed reduction order.

Every operation runs on random operands and on edge values (int8 extremes, -128, saturation
cases of maddubs, f32 specials), many times over."""
from __future__ import annotations

import numpy as np
import pytest

from llmrt import _core, runtime

F = runtime.cpu_features()
HAS_AVX2 = F["avx2"] and F["fma"] and F["f16c"]
HAS_512 = F["avx512f"] and F["avx512bw"] and F["avx512vl"] and F["avx512dq"]
pytestmark = pytest.mark.skipif(not HAS_AVX2, reason="CPU lacks AVX2: the emulation is built on it")

N_TRIALS = 200


def real_ok(op):
    if not HAS_512:
        return False
    if op in ("dpbusd", "dpwssd"):
        return F["avx512_vnni"]
    if op == "dpbf16_ps":
        return F["avx512_bf16"]
    return True


def operands(rng, op, trial):
    """Three 64-byte operands; every 4th trial uses edge values."""
    if op in ("fmadd_ps", "reduce_add_ps"):
        v = [rng.standard_normal(16).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 4))
             for _ in range(3)]
        if trial % 4 == 3:
            v[0][:4] = [np.inf, -0.0, 1e-40, 3.4e38]
        return [x.tobytes() for x in v]
    if op == "dpbf16_ps":
        a = (rng.standard_normal(32) * 3).astype(np.float32)
        b = (rng.standard_normal(32) * 3).astype(np.float32)
        c = (rng.standard_normal(16) * 10).astype(np.float32)
        if trial % 4 == 3:   # denormal bf16 inputs / accumulator, overflow
            a[:2] = [1e-39, -2e-39]
            c[1] = 1e-40
            a[4], b[4] = 1e38, 1e38
        bf = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)   # truncation: any bf16 will do
        return [bf(a).tobytes(), bf(b).tobytes(), c.tobytes()]
    if op == "cvtph_ps":
        h = (rng.standard_normal(32) * 100).astype(np.float16)
        if trial % 4 == 3:
            h[:4] = [np.inf, -0.0, 6e-8, 65504]
        return [h.tobytes(), bytes(64), bytes(64)]
    if trial % 4 == 3:
        vals = np.array([0, 1, -1, 127, -128, 255, 128, 0x0f, 0xf0], dtype=np.int64)
        return [(rng.choice(vals, 64) & 0xff).astype(np.uint8).tobytes() for _ in range(3)]
    return [rng.integers(0, 256, 64, dtype=np.uint8).tobytes() for _ in range(3)]


def i8(b):
    return np.frombuffer(b, np.int8).astype(np.int64)


def u8(b):
    return np.frombuffer(b, np.uint8).astype(np.int64)


def i16(b):
    return np.frombuffer(b, np.int16).astype(np.int64)


def i32(b):
    return np.frombuffer(b, np.int32).astype(np.int64)


def wrap(x, bits):
    x = np.asarray(x, np.int64) & ((1 << bits) - 1)
    return np.where(x >= 1 << (bits - 1), x - (1 << bits), x)


def sat16(x):
    return np.clip(x, -32768, 32767)


def ftz(x):
    x = np.asarray(x, np.float32).copy()
    x[np.abs(x) < np.finfo(np.float32).tiny] *= 0
    return x


def reference(op, a, b, c):
    """The instruction's definition in numpy -> 64 bytes."""
    if op == "add_epi8":
        return wrap(i8(a) + i8(b), 8).astype(np.int8).tobytes()
    if op == "sub_epi16":
        return wrap(i16(a) - i16(b), 16).astype(np.int16).tobytes()
    if op == "add_epi32":
        return wrap(i32(a) + i32(b), 32).astype(np.int32).tobytes()
    if op == "mullo_epi16":
        return wrap(i16(a) * i16(b), 16).astype(np.int16).tobytes()
    if op == "maddubs_epi16":
        p = u8(a) * i8(b)
        return sat16(p[0::2] + p[1::2]).astype(np.int16).tobytes()
    if op == "madd_epi16":
        p = i16(a) * i16(b)
        return wrap(p[0::2] + p[1::2], 32).astype(np.int32).tobytes()
    if op == "shuffle_epi8":
        x, idx = u8(a), u8(b)
        out = np.zeros(64, np.int64)
        for lane in range(4):
            for j in range(16):
                k = idx[16 * lane + j]
                out[16 * lane + j] = 0 if k & 0x80 else x[16 * lane + (k & 15)]
        return out.astype(np.uint8).tobytes()
    if op == "sign_epi8":
        x, s = i8(a), i8(b)
        return wrap(np.where(s < 0, -x, np.where(s == 0, 0, x)), 8).astype(np.int8).tobytes()
    if op == "srli_epi16_4":
        return (np.frombuffer(a, np.uint16) >> 4).astype(np.uint16).tobytes()
    if op == "and_or_andnot":
        x, y, z = (np.frombuffer(v, np.uint8) for v in (a, b, c))
        return ((x & y) | (~y & z)).astype(np.uint8).tobytes()
    if op == "bcast256":
        return a[:32] * 2
    if op == "bcast64":
        return a[:8] * 8
    if op == "pairsum_epi32":   # lane 2k: a[2k] + a[2k + 1], lane 2k + 1: b[2k] + b[2k + 1] (wrapping)
        s_a = (i32(a)[0::2] + i32(a)[1::2]).reshape(-1, 1)
        s_b = (i32(b)[0::2] + i32(b)[1::2]).reshape(-1, 1)
        return wrap(np.concatenate([s_a, s_b], 1).ravel(), 32).astype(np.int32).tobytes()
    if op == "unpack_epi8":
        x, y = i8(a), i8(b)
        out = np.zeros(64, np.int64)
        for lane in range(4):
            xs, ys = x[16 * lane:16 * lane + 16], y[16 * lane:16 * lane + 16]
            lo = np.stack([xs[:8], ys[:8]], 1).ravel()
            hi = np.stack([xs[8:], ys[8:]], 1).ravel()
            out[16 * lane:16 * lane + 16] = lo + hi
        return wrap(out, 8).astype(np.int8).tobytes()
    if op.startswith("unpack") and op[-2:] in ("32", "64"):   # per 128-bit lane: a's half, b's half interleaved
        w = 4 if op.endswith("32") else 8
        x, y = (np.frombuffer(v, np.uint8).reshape(4, 16 // w, w) for v in (a, b))
        h = 16 // w // 2
        xs, ys = (x[:, :h], y[:, :h]) if op.startswith("unpacklo") else (x[:, h:], y[:, h:])
        return np.stack([xs, ys], 2).tobytes()
    if op.startswith("shuf128"):   # 128-bit lanes [a0, a2, b0, b2] / [a1, a3, b1, b3]
        k = 0 if op.endswith("even") else 1
        return a[16 * k:16 * k + 16] + a[16 * (k + 2):16 * (k + 2) + 16] + b[16 * k:16 * k + 16] + b[16 * (k + 2):16 * (k + 2) + 16]
    if op == "cvtepu8_epi16":
        return u8(a)[:32].astype(np.uint16).tobytes()
    if op == "cvtepi8_epi32":
        return i8(a)[:16].astype(np.int32).tobytes()
    if op == "cvtepi32_epi16":   # vpmovdw: the low 16 bits of each i32
        return wrap(i32(a), 16).astype(np.int16).tobytes() + bytes(32)
    if op == "permutexvar_epi16":   # vpermw: lane i = table[idx[i] mod 32]
        idx, table = np.frombuffer(a, np.uint16), np.frombuffer(b, np.uint16)
        return table[idx & 31].astype(np.uint16).tobytes()
    if op == "dpbusd":
        p = (u8(a) * i8(b)).reshape(16, 4).sum(1)
        return wrap(i32(c) + p, 32).astype(np.int32).tobytes()
    if op == "dpwssd":
        p = (i16(a) * i16(b)).reshape(16, 2).sum(1)
        return wrap(i32(c) + p, 32).astype(np.int32).tobytes()
    if op == "fmadd_ps":
        x, y, z = (np.frombuffer(v, np.float32).astype(np.float64) for v in (a, b, c))
        with np.errstate(all="ignore"):   # x*y exact in f64 for f32 inputs: one rounding
            return (x * y + z).astype(np.float32).tobytes()
    if op == "cvtepi32_ps":
        return i32(a).astype(np.float32).tobytes()
    if op == "cvtph_ps":
        return np.frombuffer(a[:32], np.float16).astype(np.float32).tobytes()
    if op == "reduce_add_ps":
        v = np.frombuffer(a, np.float32)
        with np.errstate(all="ignore"):
            s8 = v[:8] + v[8:]
            s4 = s8[:4] + s8[4:]
            s2 = s4 + s4[[2, 3, 0, 1]]
            s = np.float32(s2[0] + s2[1])
        return np.array([s], np.float32).tobytes() + bytes(60)
    if op == "dpbf16_ps":
        bf = lambda x: ftz((np.frombuffer(x, np.uint16).astype(np.uint32) << 16).view(np.float32))
        x, y = bf(a), bf(b)
        acc = ftz(np.frombuffer(c, np.float32))
        with np.errstate(all="ignore"):
            acc = ftz(acc + ftz(x[1::2] * y[1::2]))
            acc = ftz(acc + ftz(x[0::2] * y[0::2]))
        return acc.astype(np.float32).tobytes()
    raise AssertionError(op)


def same_bits(x, y, op):
    """Bytes equal, NaNs of float results compared as NaN (payloads may differ)."""
    if x == y:
        return True
    if op.endswith("_ps"):
        fx, fy = np.frombuffer(x, np.float32), np.frombuffer(y, np.float32)
        return bool(np.all((fx.view(np.uint32) == fy.view(np.uint32)) | (np.isnan(fx) & np.isnan(fy))))
    return False


@pytest.mark.parametrize("op", _core.SIMDW_OPS)
def test_emulation_matches_definition_and_hardware(op):
    rng = np.random.default_rng(sum(map(ord, op)))
    check_real = real_ok(op)
    for trial in range(N_TRIALS):
        a, b, c = operands(rng, op, trial)
        emu = _core.simdw_op("emu512", op, a, b, c)
        want = reference(op, a, b, c)
        assert same_bits(emu, want, op), f"{op} trial {trial}: emulation != definition"
        if check_real:
            real = _core.simdw_op("avx512", op, a, b, c)
            assert same_bits(emu, real, op), f"{op} trial {trial}: emulation != {op} on this CPU"


def test_dpbusd_has_no_intermediate_saturation():
    """255·127 four times: 129540 in one i32 lane (maddubs would saturate pairs at 32767)."""
    a = bytes([255] * 64)
    b = bytes([127] * 64)
    c = np.zeros(16, np.int32).tobytes()
    out = np.frombuffer(_core.simdw_op("emu512", "dpbusd", a, b, c), np.int32)
    assert np.all(out == 4 * 255 * 127)


def test_emulated_level_is_opt_in_only():
    """set_isa_emulated reports its level and is left by set_isa; dispatch never emulates."""
    before = runtime.isa()
    try:
        assert runtime.set_isa_emulated("avx512_vnni") == "avx512_vnni"
        assert runtime.isa_emulated()
        assert runtime.isa() == "avx512_vnni"
        with pytest.raises(ValueError):
            runtime.set_isa_emulated("avx2")
    finally:
        runtime.set_isa(before)
    assert not runtime.isa_emulated()
