"""Call `llmrt serve` with the official OpenAI client: a streamed chat, a second turn served
from the slot's cache (usage.prompt_tokens_details.cached_tokens), four conversations at once,
and the log-probabilities of an answer's tokens with their alternatives.

    python examples/serve_client.py [BASE_URL]

BASE_URL: a running server, e.g. http://127.0.0.1:8080 (`llmrt serve model.gguf --port 8080`).
Without it, the script starts `llmrt serve` on the default model (SmolLM2-135M-Instruct, fetched
on first use) on a free loopback port and stops it at the end. Needs `pip install "llmrt[serve]"
openai`.
"""
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from openai import OpenAI


def start_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llmrt", "serve", "--port", str(port), "-np", "4",
                             "-c", "1024"])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):                      # loading (and the first download) takes a while
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return url, proc
        except OSError:
            if proc.poll() is not None:
                sys.exit("llmrt serve did not start")
            time.sleep(0.5)
    proc.kill()
    sys.exit("llmrt serve did not answer /health")


url, proc = (sys.argv[1].rstrip("/"), None) if len(sys.argv) > 1 else start_server()
client = OpenAI(base_url=url + "/v1", api_key="not-needed")
try:
    model = client.models.list().data[0].id
    print(f"server {url}, model {model}\n")

    # 1. a streamed chat answer, piece by piece
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "Give me two tips for writing clear code."}]
    t0 = time.perf_counter()
    answer = []
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=80,
                                                temperature=0.7, seed=1, stream=True,
                                                stream_options={"include_usage": True}):
        for c in chunk.choices:
            if c.delta.content:
                answer.append(c.delta.content)
                print(c.delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n[{chunk.usage.completion_tokens} tokens in {time.perf_counter() - t0:.2f} s]\n")

    # 2. the next turn: the conversation so far is in the slot's cache, only the new part is prefilled
    messages += [{"role": "assistant", "content": "".join(answer)},
                 {"role": "user", "content": "Now one more tip, in one sentence."}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=60, temperature=0,
                                       user="demo-conversation")
    print(r.choices[0].message.content)
    print(f"[prompt {r.usage.prompt_tokens} tokens, {r.usage.prompt_tokens_details.cached_tokens} "
          f"of them from the cache]\n")

    # 3. four conversations at once: decoded together, one graph run per step
    topics = ["the moon", "tea", "rivers", "owls"]
    out = {}

    def ask(topic):
        out[topic] = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"One sentence about {topic}."}],
            max_tokens=40, temperature=0).choices[0].message.content
    t0 = time.perf_counter()
    threads = [threading.Thread(target=ask, args=(t,)) for t in topics]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in topics:
        print(f"- {t}: {out[t].strip()}")
    print(f"[4 answers in {time.perf_counter() - t0:.2f} s]\n")

    # 4. how sure the model was of each token, and what else it considered
    r = client.chat.completions.create(model=model, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    for e in r.choices[0].logprobs.content:
        alts = ", ".join(f"{t.token!r} {t.logprob:.2f}" for t in e.top_logprobs[1:])
        print(f"{e.token!r:>14} {e.logprob:6.2f}   (also: {alts})")
finally:
    if proc is not None:
        proc.terminate()
        proc.wait(15)
