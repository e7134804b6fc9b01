"""A conversation saved to a file and continued in a new process (or a new Model object): the
next answer is the one the uninterrupted conversation gives, streaming cache and sampler
included. The CLI does the same with `llmrt chat --session conv.llmrt` and /save, /load.

    python examples/save_restore_chat.py [MODEL]
"""
import os
import sys
import tempfile

from llmrt import ChatSession, Model

path = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
turns = ["Hi! Name a fruit.", "Why that one?", "Name another.", "Which one is sweeter?"]
kw = dict(system="You are a concise assistant.", ctx_size=160, max_new_tokens=40, temperature=0.7, seed=1)

model = Model(path)
whole = ChatSession(model, **kw)
answers = [whole.send(t) for t in turns]               # the uninterrupted conversation

first = ChatSession(model, **kw)
for t in turns[:2]:
    first.send(t)
f = os.path.join(tempfile.mkdtemp(), "conv.llmrt")
n = first.save(f)                                      # atomic: a temp file renamed over f
print(f"saved {f}: {n / 1e6:.1f} MB, {first.session.n_past} tokens cached, "
      f"{first.session.n_shifts} shifts so far")

again = ChatSession.load(f, Model(path))               # another Model object, as a restart
rest = [again.send(t) for t in turns[2:]]
print(f"restored: {len(again.messages)} messages; {again.session.n_shifts} shifts after two more turns")
for t, a in zip(turns, answers[:2] + rest):
    print(f"> {t}\n{a.strip()}\n")
print("same answers as without the restart:", answers == answers[:2] + rest)
