"""A small dependency-free progress bar on stderr (model download, loading, quantizing, perplexity).

    with Progress(total=n_bytes, desc="download", unit="B") as p:   # bytes mode: MB, MB/s
        for chunk in chunks:
            p.update(len(chunk))

    for t in progress(tensors, desc="loading"):                      # iterator wrapper
        ...

On a terminal it redraws one line with `\\r` (at most `refresh` times a second):

    loading  42% |██████▎        | 114/272 [00:01<00:02, 95.3 it/s]

When stderr is not a TTY (CI logs, pipes) it prints a few plain lines instead (at 0 %, every
quarter and at the end), so logs stay short. `enabled=True` forces the bar, `enabled=False`
silences it; LLMRT_PROGRESS=0/1 in the environment does the same for every bar.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, TextIO

_BLOCKS = " ▏▎▍▌▋▊▉█"


def _fmt_time(s: float) -> str:
    if s != s or s == float("inf") or s < 0:
        return "--:--"
    s = int(s + 0.5)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def _fmt_mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


class Progress:
    """Progress of `total` units (None if unknown). unit="B" switches to bytes mode (MB).

    mode: "bar" (redrawn line), "lines" (a few plain lines) or "off"; chosen from `enabled`,
    LLMRT_PROGRESS and whether `file` (default stderr) is a TTY.
    """

    def __init__(self, total: int | None = None, desc: str = "", unit: str = "it",
                 enabled: bool | None = None, file: TextIO | None = None, width: int = 20,
                 refresh: float = 10.0, n_lines: int = 4):
        self.total = total if (total is None or total > 0) else None
        self.desc = desc
        self.unit = unit
        self.file = file if file is not None else sys.stderr
        self.width = width
        self.min_interval = 1.0 / refresh if refresh > 0 else 0.0
        self.n_lines = max(1, n_lines)
        self.n = 0
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._next_line_frac = 0.0   # "lines" mode: next fraction of total to report
        self._last_line_t = self.t0
        self._closed = False
        self._last_len = 0

        env = os.environ.get("LLMRT_PROGRESS", "").strip().lower()
        if enabled is None and env in ("0", "false", "off", "no"):
            enabled = False
        elif enabled is None and env in ("1", "true", "on", "yes"):
            enabled = True
        if enabled is False:
            self.mode = "off"
        elif enabled is True or self._isatty():
            self.mode = "bar"
        else:
            self.mode = "lines"
        self._draw(force=True)

    def _isatty(self) -> bool:
        try:
            return bool(self.file.isatty())
        except (AttributeError, ValueError):
            return False

    # ---- updates ----------------------------------------------------------------------------

    def update(self, n: int = 1) -> None:
        self.n += n
        self._draw()

    def set(self, n: int) -> None:
        """Set the absolute count (for callbacks that report totals so far)."""
        self.n = n
        self._draw()

    def close(self) -> None:
        if self._closed:
            return
        self._draw(force=True, final=True)
        self._closed = True

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- text -------------------------------------------------------------------------------

    def _rate(self, elapsed: float) -> float:
        return self.n / elapsed if elapsed > 0 else 0.0

    def text(self, bar: bool = True) -> str:
        """The status line (without `\\r`)."""
        elapsed = time.monotonic() - self.t0
        rate = self._rate(elapsed)
        mb = self.unit == "B"
        count = (f"{_fmt_mb(self.n)}/{_fmt_mb(self.total)} MB" if mb and self.total
                 else f"{_fmt_mb(self.n)} MB" if mb
                 else f"{self.n}/{self.total}" if self.total else f"{self.n}")
        rate_s = f"{rate / 1e6:.1f} MB/s" if mb else f"{rate:.1f} {self.unit}/s"
        head = f"{self.desc} " if self.desc else ""
        if self.total:
            frac = min(max(self.n / self.total, 0.0), 1.0)
            eta = (self.total - self.n) / rate if rate > 0 else float("inf")
            bar_s = ""
            if bar:
                cells = frac * self.width
                full = int(cells)
                part = int((cells - full) * (len(_BLOCKS) - 1))
                bar_s = "█" * full + (_BLOCKS[part] if full < self.width else "")
                bar_s = f"|{bar_s:<{self.width}}| "
            return (f"{head}{frac * 100:3.0f}% {bar_s}{count} "
                    f"[{_fmt_time(elapsed)}<{_fmt_time(eta)}, {rate_s}]")
        return f"{head}{count} [{_fmt_time(elapsed)}, {rate_s}]"

    def _draw(self, force: bool = False, final: bool = False) -> None:
        if self.mode == "off" or self._closed:
            return
        now = time.monotonic()
        if self.mode == "bar":
            if not force and now - self._last_draw < self.min_interval:
                return
            self._last_draw = now
            s = self.text()
            pad = " " * max(0, self._last_len - len(s))
            self._last_len = len(s)
            self._write("\r" + s + pad + ("\n" if final else ""))
            return
        # "lines": the first call, each 1/n_lines of the total, and the end. Without a total:
        # at most one line every 30 s.
        if final:
            self._write(self.text(bar=False) + "\n")
            return
        if self.total:
            frac = self.n / self.total
            if force or frac >= self._next_line_frac:
                if frac < 1.0:   # 100 % is printed by close()
                    self._write(self.text(bar=False) + "\n")
                while self._next_line_frac <= frac:
                    self._next_line_frac += 1.0 / self.n_lines
        elif force or now - self._last_line_t >= 30.0:
            self._last_line_t = now
            self._write(self.text(bar=False) + "\n")

    def _write(self, s: str) -> None:
        try:
            self.file.write(s)
            self.file.flush()
        except (OSError, ValueError):
            self.mode = "off"   # stderr closed: progress is never worth an exception


def progress(iterable: Iterable, total: int | None = None, desc: str = "", unit: str = "it",
             enabled: bool | None = None, file: TextIO | None = None) -> Iterator:
    """Wrap an iterable: yields its items and advances a Progress by one per item."""
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with Progress(total=total, desc=desc, unit=unit, enabled=enabled, file=file) as p:
        for x in iterable:
            yield x
            p.update(1)
