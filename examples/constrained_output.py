"""Constrained output: the answer is one JSON object, JSON that a JSON Schema accepts, or text
that a GBNF grammar accepts.

    python examples/constrained_output.py [MODEL]

1. Model.generate with response_format={"type": "json_object"}: every token keeps the text a
   prefix of a valid JSON object, and generation ends where the object closes.
2. The same question without it (the model's own choice of format).
3. A JSON Schema (OpenAI's response_format json_schema): the answer has these keys, these types.
4. A GBNF grammar (llama.cpp's format): a yes / no answer with a short reason.
5. Over HTTP (llmrt serve): OpenAI's response_format, if a server runs at $LLMRT_URL.
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

# 3. a JSON Schema: these properties, in this order, of these types (bounded: it always ends)
schema = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 30},
                         "country": {"type": "string", "maxLength": 30},
                         "population": {"type": "integer"},
                         "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 30},
                                       "maxItems": 3}},
          "required": ["city", "country", "population"]}
fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
out = model.generate(prompt, max_new_tokens=400, temperature=0, response_format=fmt)
print("\nschema:   ", json.loads(tok.decode(out[len(prompt):])))

# 4. a GBNF grammar
grammar = 'root ::= ("yes" | "no") ", because " [a-z ]{1,60} "."'
ask = tok.encode("<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n",
                 add_special=True, parse_special=True)
out = model.generate(ask, max_new_tokens=60, temperature=0, grammar=grammar)
print("\ngrammar:  ", tok.decode(out[len(ask):]))

# 5. the server: llmrt serve MODEL --port 8080, then LLMRT_URL=http://127.0.0.1:8080
url = os.environ.get("LLMRT_URL")
if url:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=os.environ.get("LLMRT_API_KEY", "none"))
    msgs = [{"role": "user", "content": question}]
    r = client.chat.completions.create(model="any", messages=msgs, temperature=0,
                                       response_format={"type": "json_object"})
    print("\nserver, json_object:", json.loads(r.choices[0].message.content))
    r = client.chat.completions.create(model="any", messages=msgs, temperature=0, response_format=fmt)
    print("server, json_schema:", json.loads(r.choices[0].message.content))
    r = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Is the sky blue?"}],
                                       temperature=0, extra_body={"grammar": grammar})    # llama-server's field
    print("server, grammar:", r.choices[0].message.content)
