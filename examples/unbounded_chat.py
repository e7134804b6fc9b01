"""A scripted chat that runs past its 128-token context several times.

The conversation lives in a streaming KV cache: with n_keep "auto" (the default) BOS and the
system prompt stay pinned; when the cache is full the oldest turns are evicted and the kept keys
are shift-RoPEd. The chat goes on for as many turns as you like (the model forgets what was
evicted, as StreamingLLM does).

    python examples/unbounded_chat.py [MODEL]
"""
import sys

from llmrt import ChatSession, Model, TextStreamer

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
chat = ChatSession(model, system="You are a concise assistant.", ctx_size=128, n_keep="auto",
                   temperature=0, max_new_tokens=40)
questions = ["Name a fruit.", "What colour is it?", "Name a country.", "What is its capital?",
             "Name an animal.", "Where does it live?", "Name a planet.", "How far is it?",
             "Say hello in French."]
for q in questions:
    print(f"> {q}")
    chat.send(q, streamer=TextStreamer(model.tokenizer, skip_prompt=True))
    s = chat.session
    print(f"   [cache {s.n_past}/{s.n_ctx}, {s.n_keep} pinned, {s.n_evicted} evicted so far]")
sys_ids = s.tokens[:s.n_keep]
print("pinned:", repr(model.tokenizer.decode(sys_ids)))
