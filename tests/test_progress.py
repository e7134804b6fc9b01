"""llmrt/progress.py: the bar on a TTY, a few plain lines otherwise, nothing when disabled."""
import io

import pytest

from llmrt.progress import Progress, _fmt_time, progress


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("LLMRT_PROGRESS", raising=False)


def test_lines_mode_when_not_a_tty():
    buf = io.StringIO()
    with Progress(total=100, desc="load", file=buf) as p:
        for _ in range(100):
            p.update(1)
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue()
    # 0 %, 25 %, 50 %, 75 % while running, 100 % at close: a few lines, not one per update
    assert [ln.split("%")[0].split()[-1] for ln in lines] == ["0", "25", "50", "75", "100"]
    assert lines[-1].startswith("load 100% 100/100 [")
    assert "it/s]" in lines[-1]


def test_bar_mode_on_tty():
    buf = FakeTTY()
    with Progress(total=10, desc="q", file=buf, refresh=0) as p:   # refresh=0: draw every update
        for _ in range(10):
            p.update()
    s = buf.getvalue()
    assert s.startswith("\r") and s.endswith("\n") and s.count("\n") == 1
    frames = s.strip("\n").split("\r")[1:]
    assert len(frames) == 12   # initial + 10 updates + final
    assert frames[0].startswith("q   0% |")
    assert "q 100% |" + "█" * 20 + "| 10/10 [" in frames[-1]


def test_refresh_limits_redraws():
    buf = FakeTTY()
    with Progress(total=10**5, file=buf, refresh=1.0) as p:
        for _ in range(10**5):
            p.update()
    assert buf.getvalue().count("\r") <= 4   # initial + final, + one a second at most


def test_bytes_mode_and_forced():
    buf = io.StringIO()   # not a TTY, but forced
    with Progress(total=5_000_000, unit="B", desc="download", file=buf, enabled=True) as p:
        p.update(2_500_000)
        p.set(5_000_000)
    last = buf.getvalue().split("\r")[-1]
    assert "5.0/5.0 MB" in last and "MB/s" in last and "100%" in last


def test_disabled_and_env(monkeypatch):
    buf = FakeTTY()
    with Progress(total=3, file=buf, enabled=False) as p:
        p.update(3)
    assert buf.getvalue() == ""
    monkeypatch.setenv("LLMRT_PROGRESS", "0")
    with Progress(total=3, file=buf) as p:
        p.update(3)
    assert buf.getvalue() == ""
    monkeypatch.setenv("LLMRT_PROGRESS", "1")
    buf2 = io.StringIO()
    with Progress(total=3, file=buf2) as p:
        p.update(3)
    assert "\r" in buf2.getvalue()


def test_iterator_wrapper_and_unknown_total():
    buf = io.StringIO()
    assert list(progress(range(7), desc="it", file=buf)) == list(range(7))
    assert buf.getvalue().splitlines()[-1].startswith("it 100% 7/7")
    buf = io.StringIO()
    assert list(progress(iter("abc"), file=buf)) == ["a", "b", "c"]   # no len(): count only
    last = buf.getvalue().splitlines()[-1]
    assert last.startswith("3 [") and "%" not in last


def test_fmt_time():
    assert _fmt_time(0) == "00:00" and _fmt_time(61.4) == "01:01"
    assert _fmt_time(3725) == "1:02:05" and _fmt_time(float("inf")) == "--:--"


def test_closed_stream_never_raises():
    buf = io.StringIO()
    p = Progress(total=2, file=buf)
    buf.close()
    p.update(2)
    p.close()
