"""Consume generated text from another thread with TextIteratorStreamer (e.g. for a web server).

    python examples/iterator_streamer.py [MODEL]
"""
import sys
import threading

from llmrt import Model, TextIteratorStreamer

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct", ctx_size=512)
streamer = TextIteratorStreamer(model.tokenizer, skip_prompt=True)
ids = model.tokenizer.encode("The three laws of robotics are")
worker = threading.Thread(target=model.generate, args=(ids,),
                          kwargs=dict(streamer=streamer, max_new_tokens=48, temperature=0))
worker.start()
for piece in streamer:          # arrives while the other thread decodes
    print(piece, end="", flush=True)
worker.join()
print()
