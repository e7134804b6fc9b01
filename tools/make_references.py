"""Reference outputs from llama.cpp (through llama-cpp-python) for the two real test models.

Writes tests/data/ref_smollm2.json and tests/data/ref_gemma3.json: tokenization, detokenization,
teacher-forced top-5 log-probs, greedy continuations and rendered chat prompts, all as produced by
llama.cpp. llmrt's tests compare against these files; llama-cpp-python is never a dependency of
llmrt itself. Run it from a separate venv that has llama-cpp-python (and jinja2, which it pulls in):

    /work/ref/venv/bin/python tools/make_references.py --model-dir /work/models

It also prints llama.cpp timings (prompt of ~128 tokens, decode) for comparison; they are not
written to the JSON files. See tests/data/README.md for the versions used.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np

import jinja2
import jinja2.sandbox
import llama_cpp
from llama_cpp import Llama

N_THREADS = 2
SEED = 1234
N_BATCH = 512
N_CTX = 512          # greedy, chat, timing: prompts are < 160 tokens, + 32 generated
N_CTX_TF = 256       # teacher forced (logits_all keeps n_ctx x n_vocab floats; texts <= 128 tokens)
TOP_K = 5
N_PREDICT = 32
FLASH_ATTN = False   # classic softmax(QK^T)V path with an f16 KV cache; recorded in "settings"
ROUND = 6            # decimals kept for log-probs (their own error is ~1e-6 in f32)

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

# Texts tokenized with parse_special=False, each with add_special True and False.
TOKENIZE_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "multiple   spaces    between     words",
    "   ",
    "line one\nline two\n\nline four",
    "tab\tseparated\tvalues\n\tindented with a tab",
    "  \n  two spaces, a newline\r\nand CRLF",
    "1 12 123 1234 12345 123456 1234567",
    "pi is 3.14159, a million is 1,000,000 and 0xDEADBEEF is hex; 9876543210123.",
    "I'm sure you'll see they've gone, don't worry. WE'RE HERE! It's John's cat. I'd've",
    "HELLO hello HeLLo hELLO",
    "Wait... what?!? (yes) [no] {maybe} \"double\" 'single' -- em—dash ~tilde~ @at #hash $5 100%",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n",
    "#include <stdio.h>\n\nint main(void) {\n\tfor (int i = 0; i < 10; i++) {\n\t\tprintf(\"%d\\n\", i * i);\n\t}\n\treturn 0;\n}\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "Visit https://example.com/path/to_file.html?query=1&b=two#frag or mail me@example.org",
    "café naïve résumé façade coöperate",
    "Grüße aus München! Die Straße, Äpfel, Öl und Übermut.",
    "L'été dernier, j'ai visité Paris — c'était magnifique ! « Bonjour », dit-il.",
    "Привет, мир! Как у тебя дела? Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "こんにちは世界。カタカナとひらがな、そして漢字。",
    "안녕하세요 세계! 한국어 문장입니다.",
    "مرحبا بالعالم! كيف حالك اليوم؟",
    "नमस्ते दुनिया! आप कैसे हैं?",
    "I love 🍕 and 🐍! 😀😃😄 ❤️ ✨",
    "Family: 👨‍👩‍👧‍👦, rainbow flag: 🏳️‍🌈, thumbs: 👍🏽 👋🏿",
    "Flags: 🇺🇸 🇫🇷 🇯🇵 🇩🇪",
    "Combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0335\u0324a\u0336lgo",
    "x² + y² = z²; ∑ᵢ aᵢ ≤ ∞; α→β; ½ ⅓ ¼",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "# Title\n\n- item 1\n- item 2\n\n**bold** and _italic_ and `code`",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<s> </s> <bos> <eos> <pad> <unk>",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "",
    " ",
    "\n",
    "\n\n\n",
    "\t",
    "a",
]

# Template-like texts with each model's real special tokens, tokenized with parse_special=True.
SPECIAL_TEXTS = {
    "smollm2": [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>assistant\nSure, here it is.<|im_end|>\n<|endoftext|>",
        "text before<|endoftext|>text after",
        "<|im_start|><|im_start|> <|im_end|>  spaced <|im_end|>",
        "<repo_name>llmrt<file_sep>setup.py\nimport os",
        "not special: <|im_start <im_start|> <|IM_START|>",
    ],
    "gemma3": [
        "<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n",
        "<start_of_turn>model\nSure, here it is.<end_of_turn>\n<eos>",
        "text before<eos>text after",
        "<start_of_turn><start_of_turn> <end_of_turn>  spaced <end_of_turn>",
        "<pad><unk><mask> <start_of_image>",
        "not special: <start_of_turn <START_OF_TURN> <bos",
    ],
}

TF_TEXTS = [
    # prose
    "The lighthouse keeper had lived alone on the island for nearly thirty years. Every evening he "
    "climbed the spiral staircase, trimmed the wick, and watched the beam sweep across the dark "
    "water. Ships rarely passed anymore, but he kept the light burning anyway, because his father "
    "had done the same, and because he believed that somewhere out there, someone might still need "
    "to find their way home.",
    # code
    "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    \"\"\"Numerically stable softmax.\"\"\"\n"
    "    m = np.max(x, axis=axis, keepdims=True)\n    e = np.exp(x - m)\n"
    "    return e / np.sum(e, axis=axis, keepdims=True)\n\n\n"
    "if __name__ == \"__main__\":\n    logits = np.array([1.0, 2.0, 3.0])\n"
    "    print(softmax(logits))\n",
    # multilingual
    "Paris is the capital of France. Paris est la capitale de la France. Berlin ist die Hauptstadt "
    "von Deutschland. Madrid es la capital de España. Москва — столица России. 东京是日本的首都。 "
    "Roma è la capitale d'Italia. Lisboa é a capital de Portugal. Amsterdam is de hoofdstad van "
    "Nederland. Stockholm är Sveriges huvudstad.",
]

GREEDY_PROMPTS = [
    "Once upon a time, in a small village at the edge of a great forest,",
    "Question: What is the capital of France?\nAnswer:",
    "Here is a list of three fruits:\n1.",
    "def is_prime(n):\n",
    "1, 2, 3, 4, 5,",
    "La Tour Eiffel est située à",
    "The three primary colors are",
    "Water boils at a temperature of",
]

CHATS = [
    {"messages": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Germany?"},
    ], "add_generation_prompt": True},
    {"messages": [
        {"role": "user", "content": "Write a haiku about the sea."},
    ], "add_generation_prompt": True},
    {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
    ], "add_generation_prompt": False},
]

TIMING_TEXT = TF_TEXTS[0] + " " + TF_TEXTS[2]


# ---- llama.cpp helpers (low-level API where the high-level one hides a flag) -------------------

def vocab_of(llm):
    return llama_cpp.llama_model_get_vocab(llm.model)


def tokenize(llm, text, add_special, parse_special):
    # llama_tokenize(vocab, text, len, out, n_max, add_special, parse_special); negative = -needed
    data = text.encode("utf-8")
    n_max = len(data) + 8
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab_of(llm), data, len(data), buf, n_max, add_special, parse_special)
    if n < 0:
        n_max = -n
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(vocab_of(llm), data, len(data), buf, n_max, add_special, parse_special)
    assert n >= 0, n
    ids = [int(buf[i]) for i in range(n)]
    # the high-level wrapper must agree (it is what most users of llama-cpp-python call)
    assert ids == llm.tokenize(data, add_bos=add_special, special=parse_special), text
    return ids


def detokenize(llm, ids, remove_special=False, unparse_special=False):
    # llama_detokenize(vocab, tokens, n, out, n_max, remove_special, unparse_special) -> bytes
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    n_max = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(n_max)
    n = llama_cpp.llama_detokenize(vocab_of(llm), arr, len(ids), buf, n_max, remove_special, unparse_special)
    assert n >= 0, n
    return buf.raw[:n]


def token_text(llm, i):
    return llama_cpp.llama_vocab_get_text(vocab_of(llm), i).decode("utf-8", errors="replace")


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def rnd(v):
    return [round(float(a), ROUND) for a in v]


def make_llm(path, n_ctx, logits_all, n_batch=N_BATCH):
    return Llama(model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=N_THREADS,
                 n_threads_batch=N_THREADS, seed=SEED, logits_all=logits_all, flash_attn=FLASH_ATTN,
                 verbose=False)


def fresh(llm):
    """Forget every token: n_tokens = 0 and clear the whole KV cache (same as a new context)."""
    llm.reset()
    mem = llama_cpp.llama_get_memory(llm.ctx)
    llama_cpp.llama_memory_clear(mem, True)


def eval_all(llm, ids):
    fresh(llm)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def last_logits(llm):
    # llama-cpp-python only copies logits into llm.scores when logits_all=True; read llama.cpp's
    # buffer for the last token of the last batch directly
    p = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(p, shape=(llm.n_vocab(),))


def greedy(llm, prompt_ids, n_predict):
    fresh(llm)
    llm.eval(prompt_ids)
    out = []
    for _ in range(n_predict):
        tok = int(np.argmax(last_logits(llm)))
        out.append(tok)
        llm.eval([tok])
    return out


# ---- chat -------------------------------------------------------------------------------------

def render_hf(template, messages, add_generation_prompt, bos_token, eos_token):
    """Render a GGUF chat template the way transformers' apply_chat_template does."""
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos_token, eos_token=eos_token)


def llama_cpp_chat(tmpl, messages, add_ass):
    """llama.cpp's own llama_chat_apply_template (built-in formats, detected from tmpl)."""
    n = len(messages)
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (llama_cpp.llama_chat_message * n)()
    for i, (r, c) in enumerate(keep):
        chat[i].role = r
        chat[i].content = c
    size = 4096
    buf = ctypes.create_string_buffer(size)
    k = llama_cpp.llama_chat_apply_template(tmpl, chat, n, add_ass, buf, size)
    assert k >= 0, f"llama_chat_apply_template failed: {k}"
    if k > size:
        buf = ctypes.create_string_buffer(k)
        k = llama_cpp.llama_chat_apply_template(tmpl, chat, n, add_ass, buf, k)
    return buf.raw[:k].decode("utf-8")


def chat_entries(llm, name, bos_text, eos_text):
    out = []
    if name == "smollm2":
        template = llm.metadata["tokenizer.chat_template"]
        for c in CHATS:
            text = render_hf(template, c["messages"], c["add_generation_prompt"], bos_text, eos_text)
            lc = llama_cpp_chat(template.encode(), c["messages"], c["add_generation_prompt"])
            out.append({"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
                        "template": "gguf tokenizer.chat_template rendered with jinja2 (HF conventions)",
                        "text": text, "ids": tokenize(llm, text, False, True),
                        "llama_cpp_text": lc, "llama_cpp_agrees": lc == text})
    else:
        # no template in the file: llama.cpp's built-in "gemma" format; BOS is written as text
        for c in CHATS:
            lc = llama_cpp_chat(b"gemma", c["messages"], c["add_generation_prompt"])
            text = bos_text + lc
            ids = tokenize(llm, text, False, True)
            assert ids == tokenize(llm, lc, True, True)
            out.append({"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
                        "template": "llama.cpp built-in 'gemma' (llama_chat_apply_template), BOS prepended",
                        "text": text, "ids": ids, "llama_cpp_text": lc})
    return out


# ---- detokenize cases -------------------------------------------------------------------------

def detok_cases(llm, name, bos, eos):
    tk = lambda s: tokenize(llm, s, False, False)
    cases = [
        tk("Hello world"),
        tk(" leading space and  two"),
        tk(TOKENIZE_TEXTS[14]),
        tk("Привет, мир! 你好，世界！"),
        tk("I love 🍕! 👨‍👩‍👧‍👦 🇯🇵"),
        tk("Combining: e\u0301 a\u0308"),
        [bos] + tk("Hello"),
        tk("The end.") + [eos],
        [bos, eos],
        [],
    ]
    vocab = {token_text(llm, i): i for i in range(llm.n_vocab())}
    if name == "smollm2":
        # byte-level BPE: 'Ċ' is byte 0x0A, 'Ġ' byte 0x20; 'ä½' + 'ł' are the bytes of 你 (e4 bd a0)
        cases += [
            [vocab["<|im_start|>"]] + tk("user\nhi") + [vocab["<|im_end|>"]],
            [vocab["Ċ"], vocab["Ġ"], vocab["Ċ"]],
            [vocab[c] for c in ("ä", "½", "ł")],           # three single-byte tokens -> 你
            [vocab["Ã"]],                                  # lone lead byte 0xC3: invalid UTF-8
            [vocab[c] for c in ("Ã", "©")] + tk(" ok"),    # c3 a9 = é
        ]
    else:
        sot, eot = vocab["<start_of_turn>"], vocab["<end_of_turn>"]
        cases += [
            [bos, sot] + tk("user\nhi") + [eot, vocab["\n"]],
            [vocab["<0x0A>"], vocab["<0x20>"], vocab["<0x0A>"]],
            [vocab["<0xE4>"], vocab["<0xBD>"], vocab["<0xA0>"]],  # byte tokens -> 你
            [vocab["<0xC3>"]],                                    # lone lead byte: invalid UTF-8
            [vocab["<0xC3>"], vocab["<0xA9>"]] + tk(" ok"),       # c3 a9 = é
        ]
    out = []
    for ids in cases:
        b = detokenize(llm, ids)
        out.append({"ids": ids, "text": b.decode("utf-8", errors="replace"), "bytes_hex": b.hex(),
                    "remove_special": False, "unparse_special": False})
    return out


# ---- timings ------------------------------------------------------------------------------------

def timings(llm, ids, n_decode=64, reps=3):
    """Best of `reps`: (prompt tok/s, decode tok/s) by wall clock around llm.eval, and the same two
    from llama.cpp's own counters (llama_perf_context: batches of >1 token count as prompt)."""
    best = [0.0, 0.0, 0.0, 0.0]
    for _ in range(reps):
        fresh(llm)
        llama_cpp.llama_perf_context_reset(llm.ctx)
        t0 = time.perf_counter()
        llm.eval(ids)
        pp = len(ids) / (time.perf_counter() - t0)
        tok = int(np.argmax(last_logits(llm)))
        t0 = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([tok])
            tok = int(np.argmax(last_logits(llm)))
        tg = n_decode / (time.perf_counter() - t0)
        perf = llama_cpp.llama_perf_context(llm.ctx)
        pp_c = 1e3 * perf.n_p_eval / perf.t_p_eval_ms
        tg_c = 1e3 * perf.n_eval / perf.t_eval_ms
        best = [max(a, b) for a, b in zip(best, (pp, tg, pp_c, tg_c))]
    return best


# ---- main -------------------------------------------------------------------------------------

def log(msg, t0=time.perf_counter()):
    print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def build(name, path, command, do_timing=True):
    log(f"{name}: load")
    llm = make_llm(path, N_CTX, logits_all=False)
    vocab = vocab_of(llm)
    bos, eos = int(llm.token_bos()), int(llm.token_eos())
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos_text, eos_text = token_text(llm, bos), token_text(llm, eos)

    ref = {
        "model": os.path.basename(path),
        "llama_cpp_python": llama_cpp.__version__,
        "command": command,
        "settings": {"n_threads": N_THREADS, "seed": SEED, "n_ctx": N_CTX, "n_ctx_teacher_forced": N_CTX_TF,
                     "n_batch": N_BATCH, "n_ubatch": N_BATCH, "flash_attn": FLASH_ATTN,
                     "logprob_decimals": ROUND, "system_info": llama_cpp.llama_print_system_info().decode()},
        "n_vocab": int(llm.n_vocab()), "bos_id": bos, "eos_id": eos, "add_bos": add_bos,
        "bos_text": bos_text, "eos_text": eos_text,
    }

    # tokenize
    tok = []
    for text in TOKENIZE_TEXTS:
        for add_special in (True, False):
            tok.append({"text": text, "add_special": add_special, "parse_special": False,
                        "ids": tokenize(llm, text, add_special, False)})
    for text in SPECIAL_TEXTS[name]:
        for add_special in (True, False):
            tok.append({"text": text, "add_special": add_special, "parse_special": True,
                        "ids": tokenize(llm, text, add_special, True)})
    ref["tokenize"] = tok
    bad = [e["text"] for e in tok if not e["parse_special"] and not e["add_special"]
           and detokenize(llm, e["ids"]).decode("utf-8", errors="replace") != e["text"]]
    log(f"{name}: {len(bad)} texts do not round-trip through tokenize/detokenize: {bad!r}")
    log(f"{name}: tokenized")
    ref["detokenize"] = detok_cases(llm, name, bos, eos)

    log(f"{name}: detokenized")
    # greedy, each from an empty cache
    g = []
    for p in GREEDY_PROMPTS:
        pids = tokenize(llm, p, True, False)
        ids = greedy(llm, pids, N_PREDICT)
        g.append({"prompt": p, "prompt_ids": pids, "n_predict": N_PREDICT, "ids": ids,
                  "text": detokenize(llm, ids).decode("utf-8", errors="replace")})
    # determinism check: the first prompt again, after the others
    assert greedy(llm, g[0]["prompt_ids"], N_PREDICT) == g[0]["ids"], "greedy not reproducible"
    ref["greedy"] = g
    log(f"{name}: greedy done")

    ref["chat"] = chat_entries(llm, name, bos_text, eos_text)

    pp_ids = tokenize(llm, TIMING_TEXT, True, False)[:128]
    log(f"{name}: chat done")
    t = timings(llm, pp_ids) if do_timing else None
    log(f"{name}: timings done")
    del llm

    # teacher forced: every position's logits in one batch
    llm = make_llm(path, N_CTX_TF, logits_all=True)
    ref["teacher_forced"] = teacher_forced(llm, TF_TEXTS)
    log(f"{name}: teacher forced done")
    del llm
    return ref, (len(pp_ids), t)


def teacher_forced(llm, texts):
    tf = []
    for text in texts:
        ids = tokenize(llm, text, True, False)
        assert 64 <= len(ids) <= 128, len(ids)
        lp = log_softmax(eval_all(llm, ids))          # [n, n_vocab]
        top = np.argsort(-lp, axis=-1, kind="stable")[:, :TOP_K]
        tf.append({"text": text, "ids": ids, "top_k": TOP_K,
                   "top_ids": top.tolist(),
                   "top_logprobs": [rnd(lp[i, top[i]]) for i in range(len(ids))],
                   "target_logprob": rnd(lp[np.arange(len(ids) - 1), ids[1:]])})
    return tf


def build_nbatch1(name, path, ref, command):
    """llama.cpp's single-token path: n_batch = n_ubatch = 1, so every matmul is a matrix-vector
    product (vec_dot / gemv kernels, no llamafile sgemm or repacked gemm). Adds
    "teacher_forced_nbatch1" (same texts, fed token by token) and "greedy_nbatch1" (same prompts,
    prompt and generation token by token) to ref; other sections are left as they are."""
    log(f"{name}: n_batch=1 greedy")
    llm = make_llm(path, N_CTX, logits_all=False, n_batch=1)
    g = []
    for p in GREEDY_PROMPTS:
        pids = tokenize(llm, p, True, False)
        ids = greedy(llm, pids, N_PREDICT)
        g.append({"prompt": p, "prompt_ids": pids, "n_predict": N_PREDICT, "ids": ids,
                  "text": detokenize(llm, ids).decode("utf-8", errors="replace")})
    del llm
    log(f"{name}: n_batch=1 teacher forced")
    llm = make_llm(path, N_CTX_TF, logits_all=True, n_batch=1)
    tf = teacher_forced(llm, TF_TEXTS)
    del llm
    ref["command_nbatch1"] = command
    ref["settings_nbatch1"] = {"n_batch": 1, "n_ubatch": 1, "n_threads": N_THREADS, "n_ctx": N_CTX,
                               "n_ctx_teacher_forced": N_CTX_TF, "flash_attn": FLASH_ATTN}
    ref["greedy_nbatch1"] = g
    ref["teacher_forced_nbatch1"] = tf
    return ref


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=os.environ.get("LLMRT_MODEL_DIR", "/work/models"))
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
    ap.add_argument("--only", choices=sorted(MODELS), help="build one model's file only")
    ap.add_argument("--no-timing", action="store_true", help="skip the llama.cpp speed measurement")
    ap.add_argument("--timing-only", type=int, metavar="REPS", default=0,
                    help="only measure llama.cpp speed, best of REPS runs; write nothing")
    ap.add_argument("--nbatch1-only", action="store_true",
                    help="only (re)compute the n_batch=1 sections, added to the existing JSON files")
    args = ap.parse_args()
    command = " ".join(["python", "tools/make_references.py"] + sys.argv[1:]) + \
        f"  (python of a venv with llama-cpp-python {llama_cpp.__version__} built from source)"
    for name, fname in MODELS.items():
        if args.only and name != args.only:
            continue
        if args.timing_only:
            llm = make_llm(os.path.join(args.model_dir, fname), N_CTX, logits_all=False)
            ids = tokenize(llm, TIMING_TEXT, True, False)[:128]
            t = timings(llm, ids, reps=args.timing_only)
            print(f"{name}: llama.cpp, {N_THREADS} threads, best of {args.timing_only}: prompt of {len(ids)} "
                  f"tokens {t[0]:.1f} tok/s (llama_perf {t[2]:.1f}), decode 64 tokens {t[1]:.1f} tok/s "
                  f"(llama_perf {t[3]:.1f})")
            continue
        out = os.path.join(args.out_dir, f"ref_{name}.json")
        path = os.path.join(args.model_dir, fname)
        if args.nbatch1_only:
            with open(out, encoding="utf-8") as f:
                ref, n_pp, t = json.load(f), 0, None
        else:
            ref, (n_pp, t) = build(name, path, command, not args.no_timing)
        ref = build_nbatch1(name, path, ref, command)
        os.makedirs(args.out_dir, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(ref, f, ensure_ascii=False, indent=None, separators=(",", ":"))
            f.write("\n")
        print(f"{name}: wrote {out} ({os.path.getsize(out) / 1024:.0f} KB)")
        if t:
            print(f"{name}: llama.cpp, {N_THREADS} threads, best of 3: prompt of {n_pp} tokens "
                  f"{t[0]:.1f} tok/s (llama_perf {t[2]:.1f}), decode 64 tokens {t[1]:.1f} tok/s "
                  f"(llama_perf {t[3]:.1f})")


if __name__ == "__main__":
    main()
