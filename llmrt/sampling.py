"""Token sampling: llama.cpp's default sampler chain, vectorized with numpy.

    s = Sampler(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=42)
    tok = s.sample(logits, prev_ids)          # logits: [n_vocab] float32, prev_ids: ids so far

The chain runs in llama.cpp's order (common/sampling.cpp, src/llama-sampler.cpp):

    logit_bias -> penalties -> top_k -> top_p -> min_p -> temperature -> dist

- logit_bias: {token id: bias} added to those ids' logits (OpenAI's logit_bias, llama.cpp's
  --logit-bias); -inf bans a token.

- penalties: every id among the last `repeat_last_n` of `prev_ids` (-1: all of them, 0: off)
  gets its logit divided by `repeat_penalty` if it is positive, multiplied if it is <= 0;
  then `count * frequency_penalty + presence_penalty` is subtracted (OpenAI-style, off by
  default).
- top_k: keep the k largest logits (k <= 0: keep all). argpartition, O(n_vocab).
- top_p: softmax over the candidates, sort descending, keep the shortest prefix whose cumulative
  probability reaches p (the token that crosses p is kept). p >= 1: off.
- min_p: keep candidates with p_i >= min_p * p_max, i.e. logit >= max_logit + log(min_p).
  min_p <= 0: off; min_p > 1 keeps the argmax alone, as min_p = 1 (llama.cpp keeps min_keep = 1).
- temperature: logits / T. T <= 0 is greedy: the argmax of the penalized logits (top_k, top_p
  and min_p always keep the argmax, so they cannot change it).
- dist: softmax over what is left and one draw from a seeded numpy Generator.

After top_k only k candidates are left, so everything past it works on a small array. Without
top_k, min_p's mask runs before top_p's sort (same result: both keep a most-probable prefix), and
top_p sorts the 256 most probable tokens first (as llama.cpp does), more only when needed.
Draws are reproducible for a given seed within llmrt; they do not reproduce llama.cpp's
std::mt19937 stream.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from llmrt.checks import C_INT_MAX, id_text, is_int, is_number

_TOP_P_FAST = 256     # top_p without top_k: look at this many most probable tokens first
_TOP_P_FAST_MIN = 1024   # ... when there are more candidates than this


class Sampler:
    """llama.cpp-style sampler chain. `seed=None` (or a negative seed) draws from OS entropy."""

    def __init__(self, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 seed: int | None = None, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, logit_bias=None):
        for name, v in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p),
                        ("repeat_penalty", repeat_penalty), ("frequency_penalty", frequency_penalty),
                        ("presence_penalty", presence_penalty)):
            if not is_number(v):
                raise TypeError(f"[Sampler] {name} must be a number, got {type(v).__name__}")
            if v != v:
                raise ValueError(f"[Sampler] {name} must be a number, got NaN")
        for name, v in (("repeat_penalty", repeat_penalty), ("frequency_penalty", frequency_penalty),
                        ("presence_penalty", presence_penalty)):
            if not np.isfinite(v):
                raise ValueError(f"[Sampler] {name} must be finite, got {v}")
        for name, v in (("top_k", top_k), ("repeat_last_n", repeat_last_n)):
            if not is_int(v):
                raise TypeError(f"[Sampler] {name} must be an integer, got {v!r}")
        if seed is not None and not is_int(seed):
            raise TypeError(f"[Sampler] seed must be an integer (or None), got {seed!r}")
        if repeat_penalty <= 0:
            raise ValueError(f"[Sampler] repeat_penalty must be > 0, got {repeat_penalty}")
        if repeat_last_n < -1:
            raise ValueError(f"[Sampler] repeat_last_n must be >= -1, got {repeat_last_n}")
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self.repeat_penalty = float(repeat_penalty)
        self.repeat_last_n = int(repeat_last_n)
        self.frequency_penalty = float(frequency_penalty)
        self.presence_penalty = float(presence_penalty)
        self.seed = seed
        self.rng = np.random.default_rng(None if seed is None or seed < 0 else seed)
        self.logit_bias = _check_logit_bias(logit_bias)
        self._lb_ids = np.fromiter(self.logit_bias, dtype=np.int64, count=len(self.logit_bias))
        self._lb_vals = np.fromiter(self.logit_bias.values(), dtype=np.float64, count=len(self.logit_bias))

    def __repr__(self):
        return (f"Sampler(temperature={self.temperature}, top_k={self.top_k}, "
                f"top_p={self.top_p}, min_p={self.min_p}, repeat_penalty={self.repeat_penalty}, "
                f"repeat_last_n={self.repeat_last_n}, seed={self.seed}"
                + (f", logit_bias={self.logit_bias}" if self.logit_bias else "") + ")")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    # ---- chain steps (each usable alone; tests check them against plain references) --------

    def check_vocab(self, n_vocab: int) -> "Sampler":
        """ValueError now, not at the first token, if logit_bias names an id past n_vocab or
        bans every token of it."""
        if self._lb_ids.size and self._lb_ids.max() >= n_vocab:
            raise ValueError(f"[Sampler] logit_bias token id {int(self._lb_ids.max())} is out of range "
                             f"for a vocabulary of {n_vocab}")
        if int(np.isneginf(self._lb_vals).sum()) >= n_vocab:       # (the ids are distinct)
            raise ValueError("[Sampler] logit_bias bans every token of the vocabulary")
        return self

    def apply_logit_bias(self, logits: np.ndarray) -> np.ndarray:
        """logits: [n_vocab]. Returns `logits` itself when there is no bias, else a copy with the
        biases added (saturated at float32's range; -inf stays a ban)."""
        if self._lb_ids.size == 0:
            return logits
        n = logits.shape[0]
        if self._lb_ids.max() >= n:
            raise ValueError(f"[Sampler] logit_bias token id {int(self._lb_ids.max())} is out of range "
                             f"for a vocabulary of {n}")
        out = logits.copy()
        v = out[self._lb_ids].astype(np.float64) + self._lb_vals
        out[self._lb_ids] = np.where(np.isneginf(v), -np.inf, np.clip(v, -_F32_MAX, _F32_MAX))
        if not np.isfinite(out.max()):
            raise ValueError("[Sampler] logit_bias bans every token of the vocabulary")
        return out

    def apply_penalties(self, logits: np.ndarray, prev_ids: Sequence[int]) -> np.ndarray:
        """logits: [n_vocab]. Returns `logits` itself when nothing applies, else a copy."""
        n = self.repeat_last_n
        if (n == 0 or len(prev_ids) == 0 or (self.repeat_penalty == 1.0
                and self.frequency_penalty == 0.0 and self.presence_penalty == 0.0)):
            return logits
        last = prev_ids if n < 0 else prev_ids[-n:]          # O(n), not O(len(prev_ids))
        last = np.asarray(last, dtype=np.int64)
        last = last[(last >= 0) & (last < logits.shape[0])]
        if last.size == 0:
            return logits
        ids, counts = np.unique(last, return_counts=True)    # ids: [u], counts: [u]
        out = logits.copy()
        v = out[ids].astype(np.float64)
        v = np.where(v <= 0, v * self.repeat_penalty, v / self.repeat_penalty)
        v = v - counts * self.frequency_penalty - self.presence_penalty
        # a tiny repeat_penalty (1e-30) or huge penalties would overflow float32 to inf (and the
        # softmax to NaN): they saturate at float32's largest value instead
        out[ids] = np.clip(v, -_F32_MAX, _F32_MAX)
        return out

    def sample(self, logits, prev_ids: Sequence[int] = (), constraint=None) -> int:
        """One token id from `logits` ([n_vocab]) given the ids seen so far (prompt + output).
        constraint (e.g. llmrt.jsonmode.Constraint): as llama.cpp's grammar sampler, the chain
        picks from the unconstrained logits first; if `constraint.allows` refuses that id, the
        logits are masked (`constraint.mask`: refused ids at -inf) and the chain runs again (one
        more draw). The caller advances the constraint with the id returned."""
        x = np.asarray(logits, dtype=np.float32)
        if x.ndim != 1 or x.shape[0] == 0:
            raise ValueError(f"[Sampler.sample] logits must be 1-D and non-empty, got shape "
                             f"{x.shape}")
        top = x.max()               # NaN if any is NaN
        if not np.isfinite(top):
            raise ValueError("[Sampler.sample] the logits are not finite (NaN or infinity): the "
                             "model's weights or activations are broken (a corrupt file?), nothing "
                             "can be sampled")
        x = self.apply_penalties(self.apply_logit_bias(x), prev_ids)
        tok = self._choose(x)
        if constraint is None or constraint.allows(tok):
            return tok
        return self._choose(constraint.mask(x, 1 if self.greedy else max(self.top_k, 0)))

    def _choose(self, x: np.ndarray) -> int:
        """The chain after the penalties: top_k, top_p, min_p, temperature, dist (or the argmax)."""
        if self.greedy:
            return int(np.argmax(x))
        ids, lg = top_k_filter(x, self.top_k)          # ids: [m] int64, lg: [m] float32
        ids, lg = top_p_min_p_filter(ids, lg, self.top_p, self.min_p)
        if ids.shape[0] == 1:
            return int(ids[0])
        # (lg - max) / T in float64: a tiny T (1e-40) gives the greedy choice, not an overflow
        with np.errstate(over="ignore"):    # -> -inf: probability 0
            p = softmax((lg.astype(np.float64) - np.max(lg)) / self.temperature)
        # one draw: first index whose cumulative probability exceeds u * total
        c = np.cumsum(p, dtype=np.float64)
        i = int(np.searchsorted(c, self.rng.random() * c[-1], side="right"))
        return int(ids[min(i, ids.shape[0] - 1)])


# ---- the filters, on (ids, logits) candidate arrays --------------------------------------------

_F32_MAX = float(np.finfo(np.float32).max)


def _check_logit_bias(bias) -> dict:
    """{id: bias} from a dict (int or decimal-string ids, as OpenAI's JSON has them) or pairs
    [(id, bias), ...]: ids >= 0, biases numbers (finite, or -inf: a ban)."""
    if bias is None:
        return {}
    items = bias.items() if isinstance(bias, dict) else bias
    out: dict[int, float] = {}
    try:
        for k, v in items:
            if (i := id_text(k)) is not None:      # ("5": a JSON key)
                k = i
            if not is_int(k, 0, C_INT_MAX):
                raise ValueError(f"[Sampler] logit_bias keys must be token ids (integers >= 0), got {k!r}")
            if not is_number(v) or v != v or v == np.inf:
                raise ValueError(f"[Sampler] logit_bias[{k}] must be a number (or -inf), got {v!r}")
            out[int(k)] = float(v)
    except (TypeError, ValueError) as e:
        if isinstance(e, ValueError) and str(e).startswith("[Sampler]"):
            raise
        raise TypeError(f"[Sampler] logit_bias must be a dict {{token id: bias}} or (id, bias) pairs, "
                        f"got {type(bias).__name__}") from None
    return out


def softmax(lg: np.ndarray) -> np.ndarray:
    """Probabilities of logits `lg` ([m]), max-subtracted, float64."""
    z = lg.astype(np.float64) - np.max(lg)
    e = np.exp(z)
    return e / e.sum()


def top_k_filter(x: np.ndarray, k: int):
    """x: [n] logits of the whole vocabulary -> (ids, logits) of the k largest, in no order."""
    n = x.shape[0]
    if k <= 0 or k >= n:
        return np.arange(n, dtype=np.int64), x
    ids = np.argpartition(x, n - k)[n - k:].astype(np.int64)
    return ids, x[ids]


def _top_p_cut(e: np.ndarray, z: float, top_p: float) -> np.ndarray:
    """Indices into `e` (unnormalized probabilities; z: their normalizer, which may include
    candidates not in e) of the shortest most-probable prefix whose probability reaches top_p,
    most probable first; all of e when it never does. Sorts only as much as needed: the 256
    largest first (llama.cpp's choice), then 8x more, then everything."""
    n = e.shape[0]
    m = _TOP_P_FAST if n > _TOP_P_FAST_MIN else n
    while True:
        if m < n:
            sel = np.argpartition(e, n - m)[n - m:]
            sel = sel[np.argsort(-e[sel])]
        else:
            sel = np.argsort(-e)
        c = np.cumsum(e[sel], dtype=np.float64) / z
        if c[-1] >= top_p or m >= n:
            last = int(np.searchsorted(c, top_p, side="left")) + 1  # first c[i] >= top_p: kept
            return sel[:min(last, m)]
        m = min(n, m * 8)


def top_p_filter(ids: np.ndarray, lg: np.ndarray, top_p: float):
    """Keep the shortest most-probable prefix whose cumulative probability is >= top_p
    (most probable first; unchanged when top_p >= 1)."""
    if top_p >= 1.0 or ids.shape[0] <= 1:
        return ids, lg
    e = np.exp(lg - np.max(lg))
    sel = _top_p_cut(e, float(e.sum(dtype=np.float64)), top_p)
    return ids[sel], lg[sel]


def min_p_filter(ids: np.ndarray, lg: np.ndarray, min_p: float):
    """Keep candidates whose probability is at least min_p times the largest one."""
    if min_p <= 0.0 or ids.shape[0] <= 1:
        return ids, lg
    keep = lg >= np.max(lg) + np.float32(np.log(min(min_p, 1.0)))   # > 1: the argmax alone, as 1
    return ids[keep], lg[keep]


def top_p_min_p_filter(ids: np.ndarray, lg: np.ndarray, top_p: float, min_p: float):
    """top_p then min_p, computed the cheap way: both keep a most-probable prefix, so the result
    is the shorter prefix. min_p's mask is applied first (O(m), usually leaves a few tokens),
    and top_p then sorts only those, with probabilities still normalized over all of `lg`."""
    if ids.shape[0] <= 1:
        return ids, lg
    if top_p >= 1.0:
        return min_p_filter(ids, lg, min_p)
    mx = np.max(lg)
    e = np.exp(lg - mx)
    z = float(e.sum(dtype=np.float64))
    if min_p > 0.0:
        keep = lg >= mx + np.float32(np.log(min(min_p, 1.0)))
        ids, lg, e = ids[keep], lg[keep], e[keep]
    sel = _top_p_cut(e, z, top_p)
    return ids[sel], lg[sel]
