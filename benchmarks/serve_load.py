#!/usr/bin/env python3
"""Load benchmark of OpenAI-compatible streaming servers: llmrt serve vs llama.cpp's llama-server.

    python benchmarks/serve_load.py MODEL.gguf [--parallel 4] [--threads 2] [--ctx-size 512]
        [--n-predict 128] [--clients 1,2,4,8] [--requests-per-client 2] [--repeat 2]
        [--llama-server PATH | --no-llama-server] [--json FILE]

Both servers run as subprocesses on the same model file, the same machine, the same number of
slots (--parallel) and threads, and the same context per slot (--ctx-size; llama-server divides
its -c among its slots, so it gets -c ctx*parallel). They alternate: llmrt, llama-server, llmrt,
llama-server ... for --repeat rounds; each round starts a fresh server, sends one warm-up
request, then for every concurrency level N of --clients runs N client threads, each sending
--requests-per-client streaming POST /v1/completions one after another (temperature 0,
ignore_eos, max_tokens --n-predict), and stops the server (SIGTERM, SIGKILL after 10 s).

Every request of a round has its own prompt (fixed English texts of 36-48 tokens; see PROMPTS),
so neither server's prefix / prompt cache turns a request into a cache hit.

Per request: time to first token (TTFT: request sent -> first chunk with non-empty text), the
gaps between successive chunks with text (inter-token latency, ITL), the tokens (the final
usage's completion_tokens, asked for with stream_options.include_usage; the chunks with text when
a server sends no usage), total time. Per (server, concurrency, round): tokens/s = all tokens of all
requests / wall time from the first request's start to the last one's end, median TTFT, ITL p50
and p99 over all gaps of all requests, and the number of requests that failed or streamed fewer
than max_tokens tokens ("bad", 0 expected with ignore_eos). Over rounds the table gives tok/s
min / median and the medians of the other metrics; --json FILE keeps every raw number.

Standard library + httpx (only for the readiness polls); the requests use http.client.
"""
import argparse
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streaming_ppl import cpu_name  # noqa: E402  (the benchmarks' one CPU-name reader)

# $LLAMA_SERVER, else llama-server on PATH, else where this project's machines build it (the
# llama.cpp tree vendored in llama-cpp-python's sdist: see benchmarks/README.md)
DEFAULT_LLAMA_SERVER = (os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
                        or "/work/ref/sdist/llama_cpp_python-0.3.36/build/bin/llama-server")
READY_TIMEOUT = 120.0           # seconds a server may take to answer GET /health with 200
STOP_GRACE = 10.0               # seconds between SIGTERM and SIGKILL
REQUEST_TIMEOUT = 600.0         # socket timeout of one streaming request

# One prompt per request of a round (a server's lifetime): requests are numbered 0, 1, ... over
# the concurrency levels of the round, and request i gets PROMPTS[i % len(PROMPTS)]. Each is a
# different English text of 36-48 tokens (SmolLM2's and Gemma 3's tokenizers, BOS included),
# different from its first words on, so a prefix cache shares nothing but BOS. From the 17th
# request of a round on, "Part k. " (k = i // len + 1) goes in front to keep them apart.
WARMUP_PROMPT = ('Nobody in the village remembers who built it. The weather station on the '
                 'hill records the temperature, the wind and the rain every ten minutes, '
                 'and once a day a volunteer walks up to check that')
PROMPTS = [
    'This is a story my father told on long winter evenings. Once upon a time, in a small '
    'village at the edge of a dark forest, there lived an old clockmaker who repaired every'
    ' clock in the valley except his own, because',
    'Books were once so rare that a single copy could cost as much as a house. The history '
    'of the printing press begins long before Gutenberg, with carved wooden blocks that '
    'monks and merchants used to copy prayers, playing cards and',
    'Almost all life on Earth depends on one chemical reaction. Photosynthesis is the '
    'process by which green plants turn sunlight, water and carbon dioxide into sugar and '
    'oxygen. Inside each leaf, tiny structures called chloroplasts',
    'Some family treasures are worth nothing to anyone else. My grandmother kept a notebook'
    ' of recipes that nobody else could read, written in a mix of three languages and full '
    'of arrows, crossed-out numbers and little drawings of',
    'Repairing things is mostly a matter of paying attention. A good bicycle mechanic '
    'listens before touching anything: a click on every turn of the pedals, a squeal when '
    'braking, or a rattle over cobblestones each tells',
    'It is hard to imagine how strange the first trains looked. When the first railway '
    'opened between two northern towns, people came from miles around to watch the engine, '
    'and many of them were sure that travelling so fast would',
    'Bread is one of the oldest foods people have made. To bake a simple loaf of bread you '
    'need flour, water, salt and yeast, some patience, and a warm corner of the kitchen '
    'where the dough can rise for about',
    'The island had no trees, no shops and only one house. The lighthouse keeper wrote in '
    'his logbook every evening: the state of the sea, the ships that passed, the oil burned'
    ' in the lamp, and sometimes a line about',
    'Insects have surprisingly rich ways of sharing information. Honeybees communicate the '
    'direction and distance of flowers to the rest of the hive with a dance, a figure-eight'
    ' walk whose angle and length tell the other bees',
    'Old people in the town still talk about the great frost. In the winter of that year '
    'the river froze so hard that the town held its market on the ice, with stalls selling '
    'roasted chestnuts, woollen gloves and',
    'It is never too late to start something new, they say. Learning to play the violin as '
    'an adult is humbling. For months every note sounds like a door that needs oil, and '
    'then one evening, quite unexpectedly,',
    'Old buildings often keep secrets for a very long time. The city library moved into the'
    ' old post office building, and the librarians discovered, behind a wall in the '
    'basement, a sorting room that still held',
    'Most accidents in the mountains happen on easy days. Mountain guides teach beginners '
    'three rules before any climb: check the weather twice, tell someone where you are '
    'going, and turn back when',
    'The harbour is the heart of the little town by the sea. Every spring the fishermen '
    'repaint their boats in bright colours, red, blue and yellow, so that from the harbour '
    'wall their families can recognise',
    "History is easier to understand when you can touch it. The museum's newest exhibit is "
    'a reconstruction of a Roman kitchen, with clay pots, a stone oven and a long table '
    'where visitors can try grinding',
    "Animals are often cleverer than we give them credit for. Our neighbour's dog has "
    'learned to open the garden gate by pushing the latch with its nose, and now every '
    'morning at seven it trots down the street to',
]


# ---------------------------------------------------------------------------- server processes

def free_port() -> int:
    """A TCP port that is free right now (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_flags(path: str) -> str:
    """`PATH --help` (flag names differ between llama.cpp builds: we drop flags it lacks)."""
    try:
        r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


class Server:
    """One server subprocess: its command, log file (stdout + stderr), start / ready / stop."""

    def __init__(self, name: str, cmd_fn):
        self.name = name
        self.cmd_fn = cmd_fn            # port -> argv
        self.proc = None
        self.port = None
        self.log = None
        self.cmd = None

    def start(self):
        self.port = free_port()
        self.cmd = self.cmd_fn(self.port)
        self.log = tempfile.NamedTemporaryFile(prefix=f"serve_load_{self.name}_", suffix=".log",
                                               delete=False)
        # Own process group (start_new_session): the terminal's Ctrl-C reaches only us, and we
        # stop the server ourselves, its whole group, in stop().
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        _CHILDREN.add(self)
        self.wait_ready()

    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log.name, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self):
        """Poll GET /health until 200 (llama-server answers 503 while loading the model)."""
        t0 = time.monotonic()
        with httpx.Client(timeout=2.0) as c:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with status {self.proc.returncode} "
                                       f"before it was ready\ncommand: {' '.join(self.cmd)}\n"
                                       f"last lines of {self.log.name}:\n{self.log_tail()}")
                try:
                    if c.get(self.base() + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > READY_TIMEOUT:
                    raise RuntimeError(f"{self.name} not ready after {READY_TIMEOUT:.0f} s "
                                       f"(GET /health)\ncommand: {' '.join(self.cmd)}\n"
                                       f"last lines of {self.log.name}:\n{self.log_tail()}")
                time.sleep(0.25)

    def stop(self, keep_log: bool = False):
        """SIGTERM to the server's process group, SIGKILL if still alive after STOP_GRACE s."""
        p = self.proc
        if p is not None and p.poll() is None:
            for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        _CHILDREN.discard(self)
        self.proc = None
        if self.log is not None:
            self.log.close()
            if not keep_log:
                try:
                    os.unlink(self.log.name)
                except OSError:
                    pass


_CHILDREN: set = set()          # servers started and not yet stopped (killed on any exit)


def kill_children():
    for s in list(_CHILDREN):
        s.stop(keep_log=True)


# ---------------------------------------------------------------------------- the client side

def stream_request(port: int, prompt: str, max_tokens: int) -> dict:
    """One streaming POST /v1/completions; returns timings of the chunks that carry text.

    The body is read line by line (server-sent events: `data: {...}` lines, blank lines between
    events) until `data: [DONE]`. Times are time.perf_counter() seconds."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    rec = {"start": time.perf_counter(), "ttft": None, "gaps": [], "tokens": 0, "chunks": 0, "total": None,
           "end": None, "error": None, "done": False}
    last = None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(500).decode(errors='replace')}"
        else:
            while True:
                line = resp.readline()
                if not line:                        # connection closed before [DONE]
                    break
                now = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):   # blank separators, ": ping" comments, event:
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    rec["done"] = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    rec["error"] = f"error event: {json.dumps(ev['error'])[:300]}"
                    break
                if ev.get("usage"):                 # kept for the JSON (not every server sends it)
                    rec["usage"] = ev["usage"]
                text = "".join(ch.get("text") or "" for ch in ev.get("choices") or [])
                if not text:
                    continue
                rec["chunks"] += 1
                if last is None:
                    rec["ttft"] = now - rec["start"]
                else:
                    rec["gaps"].append(now - last)
                last = now
            if not rec["done"] and rec["error"] is None:
                rec["error"] = "stream ended without data: [DONE]"
            # the tokens: the usage the server sent at the end (stream_options.include_usage), else
            # the text chunks (a token whose text is held back, e.g. the first bytes of a UTF-8
            # character, makes no chunk of its own: random-weight models emit many such)
            u = (rec.get("usage") or {}).get("completion_tokens")
            rec["tokens"] = u if rec["done"] and isinstance(u, int) else rec["chunks"]
    except Exception as e:                          # noqa: BLE001 - a failed request is counted
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    rec["end"] = time.perf_counter()
    rec["total"] = rec["end"] - rec["start"]
    return rec


def prompt_for(i: int) -> str:
    k, r = divmod(i, len(PROMPTS))
    return PROMPTS[r] if k == 0 else f"Part {k + 1}. {PROMPTS[r]}"


def run_level(port: int, n_clients: int, rpc: int, max_tokens: int, first: int) -> dict:
    """n_clients threads, each sending rpc requests one after another; all start together.
    Request j of client c gets prompt number first + c * rpc + j."""
    recs = [[] for _ in range(n_clients)]
    barrier = threading.Barrier(n_clients)

    def client(c):
        barrier.wait()
        for j in range(rpc):
            r = stream_request(port, prompt_for(first + c * rpc + j), max_tokens)
            r["client"], r["seq"] = c, j
            recs[c].append(r)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summarize([r for rs in recs for r in rs], max_tokens)


def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(reqs: list, max_tokens: int) -> dict:
    t0 = min(r["start"] for r in reqs)
    t1 = max(r["end"] for r in reqs)
    tokens = sum(r["tokens"] for r in reqs)
    gaps = [g for r in reqs for g in r["gaps"]]
    ttfts = [r["ttft"] for r in reqs if r["ttft"] is not None]
    bad = [r for r in reqs if r["error"] or r["tokens"] < max_tokens]
    for r in reqs:                                  # times relative to the level's start
        r["start"] -= t0
        r["end"] -= t0
    return {"wall_s": t1 - t0, "tokens": tokens, "tok_s": tokens / (t1 - t0) if t1 > t0 else 0.0,
            "ttft_med_s": statistics.median(ttfts) if ttfts else None,
            "itl_p50_s": percentile(gaps, 0.50), "itl_p99_s": percentile(gaps, 0.99),
            "n_requests": len(reqs), "n_bad": len(bad),
            "bad": [{"client": r["client"], "seq": r["seq"], "tokens": r["tokens"],
                     "error": r["error"]} for r in bad],
            "requests": reqs}


# ---------------------------------------------------------------------------- the rounds

def run_round(server: Server, levels, rpc, n_predict) -> dict:
    """Start the server, warm up, run every concurrency level, stop it."""
    t = time.monotonic()
    server.start()
    load_s = time.monotonic() - t
    try:
        w = stream_request(server.port, WARMUP_PROMPT, n_predict)
        if w["error"]:
            raise RuntimeError(f"{server.name}: the warm-up request failed: {w['error']}\n"
                               f"last lines of {server.log.name}:\n{server.log_tail()}")
        out = {"startup_s": load_s, "warmup_tokens": w["tokens"], "levels": {}}
        first = 0                       # prompt numbers run on over the levels of a round
        for n in levels:
            res = run_level(server.port, n, rpc, n_predict, first)
            first += n * rpc
            out["levels"][n] = res
            itl = res["itl_p50_s"]
            print(f"#   {server.name:12s} clients {n:2d}: {res['tok_s']:8.1f} tok/s, TTFT med "
                  f"{fmt_ms(res['ttft_med_s'])}, ITL p50 {fmt_ms(itl)} p99 "
                  f"{fmt_ms(res['itl_p99_s'])}, bad {res['n_bad']}/{res['n_requests']}",
                  file=sys.stderr, flush=True)
            for b in res["bad"][:3]:
                print(f"#     bad request: client {b['client']} seq {b['seq']}: {b['tokens']} tokens"
                      f"{', ' + b['error'] if b['error'] else ''}", file=sys.stderr, flush=True)
    except BaseException:
        server.stop(keep_log=True)
        raise
    server.stop()
    return out


def fmt_ms(x):
    return "-" if x is None else f"{1e3 * x:.1f} ms"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("model", metavar="MODEL", help="the .gguf file both servers load")
    ap.add_argument("--parallel", type=int, default=4, help="slots of each server")
    ap.add_argument("--threads", type=int, default=2, help="threads of each server")
    ap.add_argument("--ctx-size", type=int, default=512,
                    help="context per slot (llama-server gets -c ctx-size * parallel)")
    ap.add_argument("--n-predict", type=int, default=128, help="max_tokens of every request")
    ap.add_argument("--clients", default="1,2,4,8", help="concurrency levels, comma-separated")
    ap.add_argument("--requests-per-client", type=int, default=2,
                    help="streaming requests each client sends one after another")
    ap.add_argument("--repeat", type=int, default=2, help="alternated rounds per server")
    ap.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER, metavar="PATH",
                    help="llama.cpp's llama-server binary (skipped if absent)")
    ap.add_argument("--no-llama-server", action="store_true", help="benchmark llmrt only")
    ap.add_argument("--llmrt-args", default="", metavar="ARGS",
                    help="more flags for llmrt serve, e.g. \"--prefill-chunk 256\" (shell-split)")
    ap.add_argument("--json", metavar="FILE", help="write every raw number to FILE")
    a = ap.parse_args()

    model = str(Path(a.model).expanduser().resolve())
    if not os.path.isfile(model):
        ap.error(f"no such model file: {a.model}")
    try:
        levels = [int(x) for x in a.clients.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--clients must be comma-separated integers, got {a.clients!r}")
    if not levels or min(levels) < 1:
        ap.error("--clients needs at least one level, all >= 1")
    for name in ("parallel", "threads", "ctx_size", "n_predict", "requests_per_client", "repeat"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")

    # -- the servers' command lines
    def llmrt_cmd(port):
        return [sys.executable, "-m", "llmrt", "serve", model, "--host", "127.0.0.1",
                "--port", str(port), "--parallel", str(a.parallel), "--threads", str(a.threads),
                "--ctx-size", str(a.ctx_size)] + shlex.split(a.llmrt_args)

    servers = [Server("llmrt", llmrt_cmd)]
    notes = []
    if a.no_llama_server:
        notes.append("llama-server: skipped (--no-llama-server)")
    elif not (os.path.isfile(a.llama_server) and os.access(a.llama_server, os.X_OK)):
        msg = f"llama-server: skipped, no executable at {a.llama_server} (--llama-server PATH)"
        print(f"# {msg}", file=sys.stderr)
        notes.append(msg)
    else:
        helptext = llama_server_flags(a.llama_server)
        extra = ["--no-webui"] if "--no-webui" in helptext else []
        if not extra:
            notes.append("llama-server has no --no-webui flag: not passed")

        def llama_cmd(port):
            # llama-server splits -c among its -np slots (no unified KV cache when -np is given),
            # so each slot gets a.ctx_size cells, as llmrt's --ctx-size gives each slot.
            return [a.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
                    "-np", str(a.parallel), "-t", str(a.threads),
                    "-c", str(a.ctx_size * a.parallel)] + extra

        servers.append(Server("llama-server", llama_cmd))

    # -- Ctrl-C and SIGTERM: stop the servers, then exit
    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)

    header = (f"# {time.strftime('%Y-%m-%d %H:%M %Z')}, {cpu_name()}, {os.cpu_count()} logical "
              f"CPUs, load average {os.getloadavg()[0]:.2f}; model {os.path.basename(model)}; "
              f"NP (slots) {a.parallel}, T (threads) {a.threads}, ctx {a.ctx_size} per slot, "
              f"n_predict {a.n_predict}, {a.requests_per_client} requests per client, "
              f"{a.repeat} alternated rounds")
    print(header, flush=True)
    for n in notes:
        print(f"# {n}", flush=True)

    results = {s.name: [] for s in servers}         # name -> one dict per round
    commands = {}
    try:
        for rnd in range(a.repeat):
            for s in servers:
                print(f"# round {rnd + 1}/{a.repeat}: {s.name}", file=sys.stderr, flush=True)
                results[s.name].append(run_round(s, levels, a.requests_per_client, a.n_predict))
                commands[s.name] = " ".join(s.cmd_fn("P"))     # the command, port as P
    except KeyboardInterrupt:
        kill_children()
        print("# interrupted: servers stopped", file=sys.stderr)
        sys.exit(130)
    except Exception as e:                          # noqa: BLE001
        kill_children()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        kill_children()

    for name, cmd in commands.items():
        print(f"# {name}: {cmd}")

    # -- the table: over rounds, tok/s min / median, the medians of the rest
    def agg(name, n):
        rs = [r["levels"][n] for r in results.get(name, [])]
        if not rs:
            return None
        tps = [r["tok_s"] for r in rs]
        return {"tok_s_min": min(tps), "tok_s_med": statistics.median(tps),
                "ttft_med_s": med([r["ttft_med_s"] for r in rs]),
                "itl_p50_s": med([r["itl_p50_s"] for r in rs]),
                "itl_p99_s": med([r["itl_p99_s"] for r in rs]),
                "n_bad": sum(r["n_bad"] for r in rs), "n_requests": sum(r["n_requests"] for r in rs)}

    summary = {name: {n: agg(name, n) for n in levels} for name in results}
    base_n = 1 if 1 in levels else levels[0]

    def tps(x):
        return "-" if x is None else f"{x['tok_s_min']:.1f} / {x['tok_s_med']:.1f}"

    def itl(x):
        return "-" if x is None else f"{fmt_ms(x['itl_p50_s'])} / {fmt_ms(x['itl_p99_s'])}"

    print()
    print(f"| clients | llmrt tok/s (min / med) | llama-server tok/s (min / med) | ratio | "
          f"llmrt TTFT med | llama-server TTFT med | llmrt ITL p50 / p99 | "
          f"llama-server ITL p50 / p99 | llmrt scaling (vs {base_n}) | bad requests (llmrt, llama-server) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for n in levels:
        lm = summary["llmrt"][n]
        lc = summary.get("llama-server", {}).get(n)
        ratio = (f"{lm['tok_s_med'] / lc['tok_s_med']:.2f}x"
                 if lc and lc["tok_s_med"] > 0 else "-")
        b1 = summary["llmrt"][base_n]["tok_s_med"]
        scale = f"{lm['tok_s_med'] / b1:.2f}x" if b1 > 0 else "-"
        bad = (f"{lm['n_bad']}/{lm['n_requests']}, "
               + (f"{lc['n_bad']}/{lc['n_requests']}" if lc else "-"))
        print(f"| {n} | {tps(lm)} | {tps(lc)} | {ratio} | {fmt_ms(lm['ttft_med_s'])} | "
              f"{fmt_ms(lc['ttft_med_s']) if lc else '-'} | {itl(lm)} | {itl(lc)} | {scale} | {bad} |")
    total_bad = sum(x["n_bad"] for s in summary.values() for x in s.values() if x)
    if total_bad:
        print(f"\n# WARNING: {total_bad} request(s) failed or streamed fewer than {a.n_predict} "
              f"tokens (details: stderr / --json)")

    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": header, "notes": notes, "cpu": cpu_name(), "model": model,
                       "config": vars(a), "commands": commands, "prompts": PROMPTS,
                       "warmup_prompt": WARMUP_PROMPT, "summary": summary, "rounds": results},
                      f, indent=1)
        print(f"# raw numbers: {a.json}")


if __name__ == "__main__":
    main()
