"""JSON mode: the answer is one JSON object, whatever the model would have said.

    python examples/json_mode.py [MODEL]

1. Model.generate with response_format={"type": "json_object"}: every token keeps the text a
   prefix of a valid JSON object, and generation ends where the object closes.
2. The same question without it (the model's own choice of format).
3. Over HTTP (llmrt serve): OpenAI's response_format, if a server runs at $LLMRT_URL.
MODEL: a GGUF path or a short name (default: smollm2-135m-instruct, fetched on first use).
"""
import json
import os
import sys

from llmrt import Model

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct", n_threads=2)
tok = model.tokenizer
question = "Return a JSON object describing Paris with keys city, country and population."
prompt = tok.encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
                    add_special=True, parse_special=True)   # SmolLM2's chat format

# 1. JSON mode: parses, and stops at the closing brace
out = model.generate(prompt, max_new_tokens=200, temperature=0, response_format={"type": "json_object"})
answer = tok.decode(out[len(prompt):])
print("JSON mode:", answer)
print("parsed:   ", json.loads(answer))

# 2. free text: the same model, the same question
out = model.generate(prompt, max_new_tokens=40, temperature=0)
print("\nfree text:", repr(tok.decode(out[len(prompt):])))

# 3. the server: llmrt serve MODEL --port 8080, then LLMRT_URL=http://127.0.0.1:8080
url = os.environ.get("LLMRT_URL")
if url:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=os.environ.get("LLMRT_API_KEY", "none"))
    r = client.chat.completions.create(model="any", messages=[{"role": "user", "content": question}],
                                       response_format={"type": "json_object"}, temperature=0)
    print("\nserver:", json.loads(r.choices[0].message.content))
