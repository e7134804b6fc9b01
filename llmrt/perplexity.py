"""Perplexity of a model on a text: llama-perplexity's protocol, or streamed through the KV cache.

    from llmrt.perplexity import read_text, perplexity
    ids = model.tokenizer.encode(read_text("wiki.test.raw"))      # BOS per the model's add_bos
    r = perplexity(model, ids, ctx_size=512)                       # "dense": llama-perplexity
    r = perplexity(model, ids, ctx_size=128, kv_mode="shift", n_keep=4)   # StreamingLLM's eval
    print(r.ppl, r.ppl_err, r.n_tokens)

Dense mode (the default) is llama.cpp's tools/perplexity `perplexity()` with its defaults
(no --ppl-stride): the whole text is tokenized once (BOS first when the model adds one); it is
cut into n_chunk = n_tokens // n_ctx non-overlapping chunks of n_ctx tokens (the tail is
dropped; fewer than 2 * n_ctx tokens is an error); each chunk runs from an empty cache with
its first token replaced by BOS when the model adds BOS; the logits at positions
first = n_ctx/2 .. n_ctx-2 score the next token (n_ctx - 1 - first tokens per chunk). NLL is
max + log(sum exp(l - max)) - l[tok], the sum of exps in double as llama.cpp does; ppl =
exp(mean NLL) and the +/- is llama.cpp's: ppl * sqrt((mean(nll^2) - mean^2) / (count - 1)).

Stream mode (kv_mode "shift" | "recompute" | "window") is StreamingLLM's evaluation: the text
goes through ONE session of ctx_size cells, `batch` tokens at a time (1 = token by token, as
the paper does), and the cache evicts as it goes (n_keep sinks, n_discard cells per
eviction); every token from the second one on is scored by the logits of the token before it.
With batch > 1 each token of a batch sees exactly the cache it would see token by token (the
causal mask); only the eviction points move: an eviction comes before a batch that does not
fit whole, up to batch - 1 tokens earlier than token by token.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from llmrt.checks import read_utf8
from llmrt.progress import Progress

KV_MODES = ("shift", "recompute", "window")
MIN_CTX_DENSE = 4   # first = n_ctx/2 must leave at least one scored token per chunk


def read_text(path) -> str:
    """The text of `path` as llama.cpp's `-f` reads it: UTF-8, one trailing newline dropped."""
    text = read_utf8(path)
    if text.endswith("\n"):
        text = text[:-1]
    return text


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """NLL of targets[i] under logits[i]: [n, n_vocab] f32, [n] -> [n] float64.

    As llama.cpp's log_softmax: exps of (l - max) in f32, summed in f64. ValueError for logits
    that are not finite (a broken model: its perplexity is no number)."""
    logits = np.asarray(logits, dtype=np.float32)
    targets = np.asarray(targets, dtype=np.int64)
    mx = logits.max(axis=1)                                              # [n]
    if not np.isfinite(mx).all():       # NaN propagates through max; inf shows there too
        raise ValueError(f"the model's logits are not finite (NaN or infinity) at "
                         f"{int(np.sum(~np.isfinite(mx)))} of {len(mx)} positions: its weights or "
                         "activations are broken (a corrupt file?)")
    sum_exp = np.exp(logits - mx[:, None]).sum(axis=1, dtype=np.float64)  # [n]
    lt = logits[np.arange(len(targets)), targets]                        # [n]
    return -((lt - mx).astype(np.float64) - np.log(sum_exp))


def ppl_stats(nll: np.ndarray):
    """(ppl, +/- of ppl, mean nll) from per-token NLLs, as llama.cpp reports them."""
    nll = np.asarray(nll, dtype=np.float64)
    n = len(nll)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(nll.sum() / n)
    ppl = math.exp(mean)
    var = float((nll * nll).sum() / n) - mean * mean
    err = ppl * math.sqrt(var / (n - 1)) if (var > 0 and n > 1) else float("nan")
    return ppl, err, mean


@dataclass
class PerplexityResult:
    """What one run measured. positions index the token list the run was given (BOS included);
    nll[i] is the NLL of tokens[positions[i]]."""
    mode: str                       # "dense" | "shift" | "recompute" | "window"
    ctx_size: int
    n_keep: Optional[int]           # None in dense mode
    n_discard: Optional[int]
    batch: Optional[int]            # stream mode: tokens per eval
    positions: np.ndarray           # [n] int64
    tokens: np.ndarray              # [n] int64 (the scored tokens)
    nll: np.ndarray                 # [n] float64
    seconds: float
    n_chunks: int = 0               # dense mode
    running: List[float] = field(default_factory=list)   # dense: ppl after each chunk
    n_evicted: Optional[int] = None  # stream mode: cells evicted, if the session reports it

    @property
    def n_tokens(self) -> int:
        return int(len(self.nll))

    @property
    def ppl(self) -> float:
        return ppl_stats(self.nll)[0]

    @property
    def ppl_err(self) -> float:
        return ppl_stats(self.nll)[1]

    @property
    def nll_mean(self) -> float:
        return ppl_stats(self.nll)[2]

    def summary(self) -> dict:
        """The JSON object `llmrt perplexity --json` prints."""
        def num(x):
            return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x
        d = {"ppl": num(self.ppl), "n_tokens": self.n_tokens, "nll_mean": num(self.nll_mean),
             "mode": self.mode, "ctx_size": self.ctx_size, "n_keep": self.n_keep,
             "seconds": round(self.seconds, 3), "ppl_err": num(self.ppl_err)}
        if self.mode == "dense":
            d["n_chunks"] = self.n_chunks
        else:
            d.update(n_discard=self.n_discard, batch=self.batch, n_evicted=self.n_evicted)
        return d


class PerplexityInterrupted(KeyboardInterrupt):
    """Ctrl-C during a perplexity run: `result` holds what was scored before it (None when
    nothing was); it is still a KeyboardInterrupt for everything else."""

    def __init__(self, result: Optional["PerplexityResult"], interrupt: Optional[BaseException] = None):
        super().__init__("perplexity interrupted")
        self.result = result
        self.interrupt = interrupt      # the KeyboardInterrupt it replaced (a CLI's SIGTERM, ...)


def _check_tokens(model, tokens) -> np.ndarray:
    arr = np.asarray(tokens, dtype=np.int64).ravel()
    if arr.size and (arr.min() < 0 or arr.max() >= model.n_vocab):
        raise ValueError(f"token ids out of range for a vocabulary of {model.n_vocab}")
    return arr


@contextlib.contextmanager
def _keep_on_interrupt(partial):
    """Turn Ctrl-C inside the block into PerplexityInterrupted(partial())."""
    try:
        yield
    except PerplexityInterrupted:
        raise
    except KeyboardInterrupt as e:
        raise PerplexityInterrupted(partial(), e) from None


def _bos_to_replace(model) -> Optional[int]:
    tok = getattr(model, "tokenizer", None)
    if tok is not None and getattr(tok, "add_bos", False) and tok.bos_id is not None:
        return int(tok.bos_id)
    return None


def _new_session(model, ctx_size, **stream_kw):
    """model.new_session with the streaming arguments, or a plain one where the session has none
    (dense mode only needs a cache of ctx_size cells that one chunk fills)."""
    params = inspect.signature(model.new_session).parameters
    if "kv_mode" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return model.new_session(ctx_size=ctx_size, **stream_kw)
    if stream_kw.get("kv_mode", "none") != "none":
        raise ValueError("this llmrt build has no streaming cache (Session without kv_mode)")
    return model.new_session(ctx_size=ctx_size)


def perplexity_dense(model, tokens, ctx_size: int, progress: Optional[bool] = None,
                     on_chunk=None) -> PerplexityResult:
    """llama-perplexity's protocol (see the module doc). on_chunk(i, n_chunk, ppl) after each chunk."""
    n_ctx = int(ctx_size)
    if n_ctx < MIN_CTX_DENSE:
        raise ValueError(f"ctx-size {n_ctx} is too small for perplexity (minimum {MIN_CTX_DENSE})")
    toks = _check_tokens(model, tokens)
    if len(toks) < 2 * n_ctx:
        raise ValueError(f"the text tokenizes to only {len(toks)} tokens; perplexity with a context "
                         f"of {n_ctx} needs at least {2 * n_ctx}")
    n_chunk = len(toks) // n_ctx
    first = n_ctx // 2
    bos = _bos_to_replace(model)
    sess = _new_session(model, ctx_size=n_ctx, kv_mode="none")   # a chunk fills it, never more
    pos, nlls, running = [], [], []
    sum_nll, count = 0.0, 0
    t0 = time.perf_counter()

    def result():           # the chunks finished so far (running[i] is appended last)
        k = len(running)
        positions = np.concatenate(pos[:k])
        return PerplexityResult(mode="dense", ctx_size=n_ctx, n_keep=None, n_discard=None,
                                batch=None, positions=positions, tokens=toks[positions],
                                nll=np.concatenate(nlls[:k]), seconds=time.perf_counter() - t0,
                                n_chunks=k, running=running[:k])

    with Progress(total=n_chunk, desc="perplexity", unit="chunk", enabled=progress) as bar, \
            _keep_on_interrupt(lambda: result() if running else None):
        for i in range(n_chunk):
            start = i * n_ctx
            ids = toks[start:start + n_ctx].copy()     # [n_ctx]
            if bos is not None:
                ids[0] = bos
            sess.reset()
            logits = sess.eval(ids, all_logits=True)   # [n_ctx, n_vocab]
            # logits at first .. n_ctx-2 score tokens first+1 .. n_ctx-1 of the ORIGINAL text
            tgt = toks[start + first + 1:start + n_ctx]
            v = token_nll(logits[first:n_ctx - 1], tgt)
            pos.append(np.arange(start + first + 1, start + n_ctx))
            nlls.append(v)
            sum_nll += float(v.sum())
            count += len(v)
            running.append(math.exp(sum_nll / count))
            bar.desc = f"perplexity {running[-1]:.4f}"
            bar.update(1)
            if on_chunk is not None:
                on_chunk(i, n_chunk, running[-1])
    return result()


def perplexity_stream(model, tokens, ctx_size: int, kv_mode: str = "shift", n_keep: int = 4,
                      n_discard: int = -1, batch: int = 1,
                      progress: Optional[bool] = None) -> PerplexityResult:
    """StreamingLLM's evaluation through one streaming session (see the module doc)."""
    if kv_mode not in KV_MODES:
        raise ValueError(f"kv-mode must be one of {', '.join(KV_MODES)}, got {kv_mode!r}")
    n_ctx, n_keep, batch = int(ctx_size), int(n_keep), int(batch)
    if kv_mode == "window":
        n_keep = 0          # a plain sliding window: no sinks
    if n_keep < 0:
        raise ValueError(f"n-keep must be >= 0, got {n_keep}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if n_ctx < n_keep + batch + 1:
        raise ValueError(f"ctx-size {n_ctx} is too small: it must hold the {n_keep} sink tokens "
                         f"plus a batch of {batch} and one more token")
    toks = _check_tokens(model, tokens)
    if len(toks) < 2:
        raise ValueError(f"the text tokenizes to {len(toks)} token(s); at least 2 are needed")
    sess = _new_session(model, ctx_size=n_ctx, n_keep=n_keep, n_discard=n_discard, kv_mode=kv_mode)
    n = len(toks)
    nll = np.empty(n - 1, dtype=np.float64)   # nll[j] scores toks[j + 1]
    sum_nll = 0.0
    t0 = time.perf_counter()
    done = 0                                  # nll[:done] is filled

    def result():
        return PerplexityResult(mode=kv_mode, ctx_size=n_ctx, n_keep=n_keep,
                                n_discard=int(n_discard), batch=batch,
                                positions=np.arange(1, done + 1), tokens=toks[1:done + 1],
                                nll=nll[:done], seconds=time.perf_counter() - t0,
                                n_evicted=getattr(sess, "n_evicted", None))

    with Progress(total=n, desc="perplexity", unit="tok", enabled=progress) as bar, \
            _keep_on_interrupt(lambda: result() if done else None):
        for i in range(0, n, batch):
            ids = toks[i:i + batch]
            logits = sess.eval(ids, all_logits=True)             # [len(ids), n_vocab]
            logits = logits.reshape(len(ids), -1)
            m = min(len(ids), n - 1 - i)                         # rows that have a next token
            if m > 0:
                v = token_nll(logits[:m], toks[i + 1:i + 1 + m])
                nll[i:i + m] = v
                done = i + m
                sum_nll += float(v.sum())
                bar.desc = f"perplexity {math.exp(sum_nll / (i + m)):.4f}"
            bar.update(len(ids))
    return result()


def perplexity(model, tokens, ctx_size: int, kv_mode: Optional[str] = None, n_keep: int = 4,
               n_discard: int = -1, batch: int = 1, progress: Optional[bool] = None,
               max_tokens: Optional[int] = None) -> PerplexityResult:
    """Dense (kv_mode None: llama-perplexity) or streamed perplexity of `tokens`; max_tokens
    keeps only the first tokens of the text."""
    if max_tokens is not None:
        if int(max_tokens) < 2:
            raise ValueError(f"max-tokens must be >= 2, got {max_tokens}")
        tokens = list(tokens)[:int(max_tokens)]
    if kv_mode is None or kv_mode == "dense":
        return perplexity_dense(model, tokens, ctx_size, progress=progress)
    return perplexity_stream(model, tokens, ctx_size, kv_mode=kv_mode, n_keep=n_keep,
                             n_discard=n_discard, batch=batch, progress=progress)


def write_nll_csv(result: PerplexityResult, path) -> None:
    """position,token,nll — one row per scored token."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("position,token,nll\n")
        for p, t, v in zip(result.positions.tolist(), result.tokens.tolist(), result.nll.tolist()):
            f.write(f"{p},{t},{v:.6f}\n")


def plot_nll(result: PerplexityResult, path, title: str = "") -> None:
    """NLL over position (points) with a running mean over 64 tokens; needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'llmrt[plot]' "
                         "(or pip install matplotlib)") from None
    w = 64
    fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
    ax.plot(result.positions, result.nll, ".", ms=1.5, alpha=0.35, label="NLL per token")
    if len(result.nll) >= w:
        c = np.cumsum(np.concatenate([[0.0], result.nll]))
        ax.plot(result.positions[w - 1:], (c[w:] - c[:-w]) / w, lw=1.5,
                label=f"mean of the last {w}")
    if result.mode != "dense":
        ax.axvline(result.ctx_size, color="gray", ls="--", lw=1, label="ctx-size (first eviction)")
    ax.set_xlabel("position in the text (tokens)")
    ax.set_ylabel("NLL (nats)")
    ax.set_title(title or f"{result.mode}, ctx {result.ctx_size}: ppl {result.ppl:.3f}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
