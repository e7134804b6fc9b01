"""Token log-probabilities and logit bias, from Python and over HTTP.

    python examples/score_and_bias.py [MODEL]

1. Score a sentence: each token's log-probability given the ones before it (the engine's
   prompt_logprobs; over HTTP, completions' echo + logprobs, what lm-evaluation-harness sends).
2. How sure the model is of its answer: each generated token's log-probability and the runners-up.
3. logit_bias: ban the most likely first token and see what comes instead.
MODEL: a GGUF path or a short name (default: smollm2-135m-instruct, fetched on first use).
"""
import sys

from llmrt import Model
from llmrt.engine import Engine

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct", n_threads=2)
tok = model.tokenizer


def show(i):
    return repr(tok.token_to_piece(i).decode("utf-8", errors="replace"))


with Engine(model, n_parallel=2, ctx_size=512) as engine:
    # 1. a sentence scored token by token (max_tokens=0: nothing generated)
    for text in ("The cat sat on the mat.", "Mat the on sat cat the."):   # a sentence, its words shuffled
        r = engine.submit(text, max_tokens=0, logprobs=0, prompt_logprobs=True).wait()
        total = sum(e.logprob for e in r.prompt_logprobs)
        print(f"{text!r}: log-probability {total:.2f} over {len(r.prompt_logprobs)} tokens")

    # 2. a greedy answer, each token with its two runners-up
    r = engine.submit("The capital of France is", max_tokens=6, temperature=0, logprobs=2).wait()
    print("\nanswer:", repr(r.text))
    for e in r.logprobs:
        others = ", ".join(f"{show(i)} {lp:.2f}" for i, lp in e.top[1:])
        print(f"  {show(e.id):>12} {e.logprob:6.2f}   (runners-up: {others})")

    # 3. the first token banned: the next most likely one comes instead
    first = r.logprobs[0].id
    b = engine.submit("The capital of France is", max_tokens=6, temperature=0,
                      logit_bias={first: float("-inf")}).wait()
    print(f"\nwith {show(first)} banned:", repr(b.text))

# the same over HTTP (llmrt serve): completions with "echo": true, "logprobs": 1, "max_tokens": 0
# score a prompt; "logit_bias": {"<id>": -100} bans a token (see README, Serving)
