"""Two replicas of llmrt serve on a local Ray Serve instance, and what conversation affinity does:
each conversation's requests (the `serve_multiplexed_model_id` header) reach the replica that
holds its cache, so every later turn is served from cached prompt tokens.

    pip install "llmrt[ray]"
    python examples/ray_serve.py [MODEL]

Starts `llmrt serve MODEL --ray --replicas 2` on a free loopback port, talks to it with the
openai client, and stops it (and Ray) at the end.
"""
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from openai import OpenAI

model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
proc = subprocess.Popen([sys.executable, "-m", "llmrt", "serve", model, "--ray", "--replicas", "2",
                         "--port", str(port), "-t", "1", "-c", "512"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
url = f"http://127.0.0.1:{port}"
try:
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    for conv in ("alice", "bob", "carol", "dave", "erin"):
        client = OpenAI(base_url=url + "/v1", api_key="none",
                        default_headers={"serve_multiplexed_model_id": conv})
        messages = [{"role": "user", "content": f"My name is {conv}. Say hello."}]
        for turn in range(3):
            raw = client.chat.completions.with_raw_response.create(
                model="any", messages=messages, max_tokens=24, temperature=0)
            r = raw.parse()
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "Tell me one more thing."}]
            print(f"{conv} turn {turn}: replica {raw.headers['x-llmrt-replica']}, "
                  f"{r.usage.prompt_tokens_details.cached_tokens} of {r.usage.prompt_tokens} prompt "
                  f"tokens cached")
finally:
    proc.send_signal(signal.SIGINT)      # serve.shutdown() and ray.shutdown()
    proc.wait(60)
