"""Replicas of llmrt serve on Ray Serve (llmrt/ray_serve.py), on a local Ray instance (loopback):
2 replicas, 4 conversations; each conversation stays on one replica (its prefix cache keeps
working), the conversations land on both; a killed replica is replaced while the other keeps
answering.

Skips, with the reason, without the ray extra (pip install -e ".[ray]"; the test extra has it).

Run: python -m pytest -q tests/test_ray_serve.py
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray.serve", reason='Ray Serve is the ray extra: pip install -e ".[ray]"')
httpx = pytest.importorskip("httpx", reason="httpx is a test extra")

from fake_lm import real_model_path  # noqa: E402
from test_server import _free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.serve, pytest.mark.ray]

START_TIMEOUT = 300
HEADER = "serve_multiplexed_model_id"


def _ray_stop():
    ray = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    _ray_stop()                                 # no instance left over from elsewhere
    port = _free_port()
    log = tmp_path_factory.mktemp("ray") / "serve.log"
    f = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "llmrt", "serve", real_model_path("smollm2-135m-instruct"),
                             "--ray", "--replicas", "2", "--port", str(port), "-t", "1", "-c", "256"],
                            stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llmrt serve --ray exited:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > START_TIMEOUT:
                raise RuntimeError(f"no answer in {START_TIMEOUT} s:\n{log.read_text()[-4000:]}")
            time.sleep(0.5)
        # /health answers once one replica is up; the router hashes over the replicas that are
        # up, so wait for both before any conversation is placed
        seen, k = set(), 0
        while len(seen) < 2:
            if time.monotonic() - t0 > START_TIMEOUT:
                raise RuntimeError(f"only replicas {seen} in {START_TIMEOUT} s:\n{log.read_text()[-4000:]}")
            r = httpx.get(url + "/health", headers={HEADER: f"probe-{k}"}, timeout=60)
            seen.add(r.headers["x-llmrt-replica"])
            k += 1
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)         # serve.shutdown + ray.shutdown
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        f.close()
        _ray_stop()


def _chat(url, conv, messages, retries=0):
    for attempt in range(retries + 1):
        try:
            r = httpx.post(url + "/v1/chat/completions", timeout=120, headers={HEADER: conv},
                           json={"messages": messages, "max_tokens": 12, "temperature": 0})
            if r.status_code == 200:
                return r.headers["x-llmrt-replica"], r.json()
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{conv}: no answer after {retries + 1} tries")


def test_affinity_and_a_replica_replaced(cluster):
    url = cluster
    # 4 conversations, at least one on each replica. The router hashes the conversation id; a
    # GET /health with the header goes where the conversation's requests go and names its
    # replica without using a slot, so look for 4 ids covering both replicas (of at most 32).
    first = {}
    for i in range(32):
        c = f"conv-{i}"
        r = httpx.get(url + "/health", headers={HEADER: c}, timeout=60)
        first[c] = r.headers["x-llmrt-replica"]
        by = {}
        for k, v in first.items():
            by.setdefault(v, []).append(k)
        if len(by) == 2:
            a, b = by.values()
            if len(a) + len(b) >= 4:
                picked = a[:3] + b[:1] if len(a) >= 3 else a + b[:4 - len(a)]
                break
    else:
        raise AssertionError(f"32 conversation ids all on one replica: {first}")
    convs = {c: [{"role": "user", "content": f"Tell me about the number {c[5:]}."}] for c in picked}
    where = {c: {first[c]} for c in convs}
    for turn in range(3):
        for c, msgs in convs.items():
            replica, body = _chat(url, c, msgs, retries=2)
            where[c].add(replica)
            if turn:        # the conversation so far came from its replica's cache
                assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 10, c
            msgs += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "Go on."}]
    assert all(len(r) == 1 for r in where.values()), where          # each stays on one replica
    homes = {c: next(iter(r)) for c, r in where.items()}
    assert len(set(homes.values())) == 2, homes                      # and they land on both

    # kill one replica (a crash): the other keeps answering, the dead one is replaced
    victim = homes[next(iter(convs))]
    survivor = next(r for r in homes.values() if r != victim)
    os.kill(int(victim.split(":")[1]), signal.SIGKILL)
    for c in convs:
        replica, _ = _chat(url, c, convs[c][:1], retries=5)
        assert replica != victim
        if homes[c] == survivor:
            assert replica == survivor                               # untouched by the crash
    seen = set(homes.values())
    t0 = time.monotonic()
    new = None
    k = 0
    while new is None and time.monotonic() - t0 < 180:
        replica, _ = _chat(url, f"late-{k}", [{"role": "user", "content": "Hi"}], retries=5)
        k += 1
        if replica not in seen:
            new = replica
        else:
            time.sleep(1)
    assert new is not None, "no replacement replica answered within 180 s"
    assert httpx.get(url + "/health", timeout=10).status_code == 200
