"""A multi-turn chat session in Python: the conversation stays in the KV cache and each turn only
evaluates its new tokens. The chat template comes from the GGUF file (or a built-in one).

    python examples/chat_session.py [MODEL]
"""
import sys

from llmrt import ChatSession, Model, TextStreamer

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct", ctx_size=1024)
chat = ChatSession(model, system="You are a concise assistant.", temperature=0, max_new_tokens=96)
for question in ["What is the capital of France?", "And what river flows through it?"]:
    print(f"> {question}")
    chat.send(question, streamer=TextStreamer(model.tokenizer, skip_prompt=True))
    print()
print(f"[{chat.session.n_past} tokens in the cache]")
