"""Importance of each matmul input column for weight-only quantization ("imatrix").

int4 rounding error in column j of a weight matters in proportion to the activation a_j that
multiplies it: the output error of y = W a is sum_j (W - Wq)_ij a_j, whose expected square is
(for roughly independent errors) sum_j (W - Wq)_ij^2 E[a_j^2]. So the int4 search minimises
sum_j w_j (x_j - q_j)^2 with w_j = E[a_j^2] (llama.cpp's imatrix, AWQ's activation-aware
scaling): columns fed by large activations get the precision.

    imp = calibrate(gguf, family, hparams, ids)   # {weight name: E[a^2] per column, float32 (K,)}

calibrate runs the model's own graph builder (llmrt/models/<family>.py build_graph) eagerly in
numpy over one token sequence (F32/F16/BF16 weights, f32 arithmetic; the output head is skipped:
its input is not needed and it is the largest matmul), and accumulates sum a_j^2 at the input of
every mul_mat. It is a calibration pass, not an inference path: RoPE scaling beyond linear
(YaRN's ramp) is not modelled, which only changes statistics slightly.

The calibration tokens come from CALIB_TEXT (llmrt/data/calib.txt, prose written for this
purpose, different from any evaluation text), tokenized with the model's tokenizer.
"""
from __future__ import annotations

import logging
import math
import os
import time
from typing import Dict, Optional

import numpy as np

log = logging.getLogger("llmrt")

CALIB_TEXT = os.path.join(os.path.dirname(__file__), "data", "calib.txt")
CALIB_TOKENS = 256          # tokens of the calibration pass (one sequence)


def _rows_f32(t) -> np.ndarray:
    """A float tensor's rows as float32 (numpy shape (ne1, ne0))."""
    if t.type == 30:                                          # BF16 as raw uint16
        return (np.asarray(t.data).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(t.data, dtype=np.float32)


class _W:
    """A weight handle of the eager builder: its name and tensor."""
    __slots__ = ("name", "t")

    def __init__(self, name, t):
        self.name, self.t = name, t


class _Stacked:
    """A merged expert tensor made at load from an old file's per-expert tensors."""
    __slots__ = ("data", "type", "shape")

    def __init__(self, data, type_id, shape):
        self.data = data.reshape(tuple(reversed(shape)))
        self.type, self.shape = type_id, shape


class _Weights:
    def __init__(self, gguf, stacked=None):
        self.f = gguf
        self.stacked = {n: _Stacked(*v) for n, v in (stacked or {}).items()}

    def has(self, name):
        return name in self.f.tensors or name in self.stacked

    def __call__(self, name):
        t = self.f.tensors[name] if name in self.f.tensors else self.stacked[name]
        if len(t.shape) == 1:
            return _rows_f32(t).reshape(-1)
        return _W(name, t)


class _Eager:
    """The Graph builder's methods (cysrc/graph.pxi), evaluated at once in numpy. Activations
    are numpy arrays with the token axis FIRST: ggml [ne0, ne1, n] is numpy (n, ne1, ne0)."""

    def __init__(self, ids, skip, keep=(), bar=None):
        self.bar = bar                         # a Progress, one step per mul_mat
        self.ids = np.asarray(ids, dtype=np.int64)
        self.keep = set(keep)                  # weight names whose inputs are kept (n, K)
        self.inputs: Dict[str, np.ndarray] = {}
        self.n = len(self.ids)
        self.skip = skip                       # weight names whose mul_mat is not computed
        self.sq: Dict[str, np.ndarray] = {}    # name -> sum over tokens of a^2 (K,) float64
        self.count: Dict[str, int] = {}
        self.output = None

    def input_tokens(self):
        return self.ids

    def input_positions(self):
        return np.arange(self.n, dtype=np.float64)

    def input_out_rows(self, max_out):
        return np.array([self.n - 1])

    def get_rows(self, w, tok):
        t = w.t
        rows = np.asarray(t.data)[tok]
        return (rows.astype(np.uint32) << 16).view(np.float32) if t.type == 30 else rows.astype(np.float32)

    def get_rows_f32(self, x, rows):
        return None if x is None else x[rows]

    def rms_norm(self, x, eps):
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)).astype(np.float32)

    def mul(self, a, b):
        return None if a is None else a * b

    def add(self, a, b):
        return None if a is None or b is None else a + b

    def scale(self, a, s):
        return None if a is None else a * np.float32(s)

    def mul_mat(self, w, x):
        x2 = np.ascontiguousarray(x.reshape(x.shape[0], -1), dtype=np.float32)
        if isinstance(w, np.ndarray):        # a 1-D weight (a shared-expert gate): one output
            return x2 @ w.reshape(1, -1).T
        acc = self.sq.get(w.name)
        s = np.einsum("nk,nk->k", x2, x2, dtype=np.float64)
        self.sq[w.name] = s if acc is None else acc + s
        self.count[w.name] = self.count.get(w.name, 0) + x2.shape[0]
        if w.name in self.keep:
            self.inputs[w.name] = x2.copy()
        if self.bar is not None:
            self.bar.update(1)
        if w.name in self.skip:
            return None
        return x2 @ _rows_f32(w.t).T

    def reshape(self, x, ne):
        return x.reshape((x.shape[0],) + tuple(reversed(ne)))

    # mixture of experts (moe.c's ops); the route is (weights (n, k), ids (n, k))
    def moe_route(self, logits, k, gating="softmax", norm=True, scale=1.0, bias=None):
        lg = logits.astype(np.float64)
        if gating == "softmax":
            p = np.exp(lg - lg.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
        else:
            p = 1.0 / (1.0 + np.exp(-lg))
        sel = p + (np.asarray(bias, dtype=np.float64) if bias is not None else 0.0)
        ids = np.argsort(-sel, axis=-1, kind="stable")[:, :k]
        w = np.take_along_axis(p, ids, axis=-1)
        if norm:
            w /= np.maximum(w.sum(axis=-1, keepdims=True), 6.103515625e-5)
        return (w * scale).astype(np.float32), ids

    def mul_mat_id(self, w, x, route, up=None, act=None):
        """Expert importance: E[a^2] of each expert's own tokens, {name: (n_expert, K)}."""
        _, ids = route
        n, k = ids.shape
        data = _rows_f32(w.t)                                  # (E, M, K)
        n_exp, m = data.shape[0], data.shape[1]
        xs = x if x.ndim == 3 else np.broadcast_to(x[:, None, :], (n, k, x.shape[-1]))
        out = np.zeros((n, k, m), dtype=np.float32)
        dup = _rows_f32(up.t) if up is not None else None
        sq = np.zeros((n_exp, xs.shape[-1]), dtype=np.float64)
        cnt = np.zeros(n_exp, dtype=np.int64)
        for e in np.unique(ids):
            tok, slot = np.nonzero(ids == e)
            xe = np.ascontiguousarray(xs[tok, slot], dtype=np.float32)
            sq[e] += np.einsum("nk,nk->k", xe, xe, dtype=np.float64)
            cnt[e] += len(tok)
            y = xe @ data[e].T
            if up is not None:
                y = self.glu(y, xe @ dup[e].T, act)
            out[tok, slot] = y
        for name in (w.name,) + ((up.name,) if up is not None else ()):
            self.sq[name] = sq if name not in self.sq else self.sq[name] + sq
            self.count[name] = cnt if name not in self.count else self.count[name] + cnt
        if self.bar is not None:
            self.bar.update(1 if up is None else 2)
        return out

    def moe_sum(self, x, route, shared=None, shared_gate=None):
        wts, _ = route
        y = np.einsum("nkm,nk->nm", x, wts)
        if shared is not None:
            y = y + shared / (1.0 + np.exp(-shared_gate))
        return y.astype(np.float32)

    def rope(self, x, pos, n_rot, mode, freq_base, freq_scale=1.0, ext_factor=0.0,
             attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0, freq_factors=None):
        half = n_rot // 2
        inv = freq_base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
        if freq_factors is not None:
            inv = inv / np.asarray(freq_factors, dtype=np.float64)
        th = pos[:, None] * freq_scale * inv[None, :]              # (n, half)
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        y = x.copy()
        if mode == 0:                                              # pairs (2i, 2i+1)
            a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            y[..., 0:n_rot:2], y[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
        else:                                                      # NeoX: (i, i + n_rot/2)
            a, b = x[..., :half], x[..., half:n_rot]
            y[..., :half], y[..., half:n_rot] = a * c - b * s, a * s + b * c
        return (y * attn_factor).astype(np.float32)

    def attention(self, q, k, v, cache, layer, scale, n_swa=0, softcap=0.0):
        n, hq, _ = q.shape
        hkv = k.shape[1]
        rep = hq // hkv
        # contiguous operands: numpy's matmul on strided stacks is a slow non-BLAS loop
        qq = np.ascontiguousarray(q.transpose(1, 0, 2))                          # (hq, n, d)
        kk = np.ascontiguousarray(np.repeat(k, rep, axis=1).transpose(1, 2, 0))  # (hq, d, n)
        vv = np.ascontiguousarray(np.repeat(v, rep, axis=1).transpose(1, 0, 2))  # (hq, n, dv)
        sc = (qq @ kk) * np.float32(scale)                                       # (hq, n, n)
        if softcap > 0:
            sc = softcap * np.tanh(sc / softcap)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        mask = j > i
        if n_swa > 0:
            mask |= (i - j) >= n_swa
        sc = np.where(mask[None], -np.inf, sc)
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        p = sc / sc.sum(axis=-1, keepdims=True)
        return (p @ vv).transpose(1, 0, 2).reshape(n, -1).astype(np.float32)

    def silu(self, x):
        return x / (1.0 + np.exp(-x))

    def gelu(self, x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    def glu(self, gate, up, act):
        return (self.silu(gate) if act == "silu" else self.gelu(gate)) * up

    def softcap(self, x, cap):
        return None if x is None else cap * np.tanh(x / cap)

    def set_output(self, y):
        self.output = y


def calibrate(gguf, family, hparams, ids, skip=(), progress: Optional[bool] = None,
              stacked=None) -> Dict[str, np.ndarray]:
    """E[a_j^2] at the input of every matmul weight over one forward pass of `ids` (the model's
    graph, evaluated eagerly in numpy): {weight name: float32 (K,)}, for an expert tensor one row
    per expert (n_expert, K) over the tokens routed to it. `skip`: weight names whose product is
    not computed (the output head: nothing reads its result). `stacked`: merged expert tensors
    made at load from per-expert ones ({name: (data, type, shape)})."""
    from llmrt.progress import Progress
    t0 = time.perf_counter()
    from llmrt.gguf import is_expert_tensor

    n_mm = sum(1 for n, t in gguf.tensors.items()   # old files' per-expert tensors: merged (stacked)
               if (len(t.shape) == 2 or "_exps." in n) and n != "token_embd.weight"
               and not (is_expert_tensor(n) and "_exps." not in n))
    n_mm += len(stacked or {})
    n_mm += "output.weight" not in gguf.tensors          # the tied head reads token_embd
    with Progress(total=n_mm, desc="calibrating", unit="matmuls", enabled=progress) as bar:
        g = _Eager(ids, set(skip), bar=bar)
        with np.errstate(over="ignore", under="ignore"):
            family.build_graph(g, hparams, _Weights(gguf, stacked), None, True)
    out = {}
    for name, s in g.sq.items():
        c = g.count[name]
        out[name] = (s / (np.maximum(1, c)[:, None] if np.ndim(c) else max(1, c))).astype(np.float32)
    log.info("llmrt: calibration pass: %d tokens, %d matmul inputs in %.2f s", len(ids), len(out),
             time.perf_counter() - t0)
    return out


def norm_importance(gguf) -> Dict[str, np.ndarray]:
    """Data-free importance: a matmul fed by an RMS norm (attn_q/k/v after attn_norm, ffn_gate/up
    after ffn_norm) gets gamma_j^2, the square of the norm weight as the graph multiplies by it
    (GGUF files of Gemma already hold 1 + gamma); other matmuls none (uniform). Not used at load:
    measured far worse than the calibration pass (Gemma 3 270M int4 asym g32: +21.5 % perplexity
    vs +5.4 %; the normalized activations are far from uniform), kept for that comparison."""
    out = {}
    feeds = {"attn_norm": ("attn_q", "attn_k", "attn_v"), "ffn_norm": ("ffn_gate", "ffn_up")}
    for name, t in gguf.tensors.items():
        parts = name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in feeds or parts[3] != "weight":
            continue
        g2 = np.square(_rows_f32(t).reshape(-1).astype(np.float64)).astype(np.float32)
        for m in feeds[parts[2]]:
            wn = f"blk.{parts[1]}.{m}.weight"
            if wn in gguf.tensors:
                out[wn] = g2
    return out


def calibration_ids(tokenizer, n_tokens: int = CALIB_TOKENS) -> list:
    """The first n_tokens tokens of CALIB_TEXT (with the model's BOS if it adds one)."""
    with open(CALIB_TEXT, encoding="utf-8") as fh:
        text = fh.read()
    return list(tokenizer.encode(text, add_special=True, parse_special=False))[:n_tokens]


def model_importance(gguf, family, hparams, tokenizer, output_name: str,
                     progress: Optional[bool] = None, stacked=None) -> Optional[Dict[str, np.ndarray]]:
    """The calibration pass of a model about to be quantized at load: {weight name: E[a^2]}, or
    None (logged) when the model has no tokenizer to encode the calibration text."""
    if tokenizer is None:
        log.warning("llmrt: no tokenizer: int4 rounding without calibration (unweighted search)")
        return None
    ids = calibration_ids(tokenizer)
    return calibrate(gguf, family, hparams, ids, skip={output_name}, progress=progress, stacked=stacked)
