"""llmrt command line: `llmrt info|chat|generate|...`.

Every command turns expected failures (bad model file, bad arguments) into one clear line on
stderr and a non-zero exit code; no traceback.
"""
import functools
import os
import sys

import click

from llmrt.errors import ModelFormatError


def friendly_errors(fn):
    """Print `error: ...` (one line) and exit 1 on expected failures instead of a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ModelFormatError, FileNotFoundError, ValueError, OSError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmrt")
def main():
    """llmrt: a llama.cpp-compatible LLM runtime for CPUs with a streaming KV cache."""


# ---- commands are defined below, one section each --------------------------------------------


# ---- info ---------------------------------------------------------------------------------------

def _fmt_hparam(v) -> str:
    """A metadata value on one line: long arrays are summarized."""
    import numpy as np
    if isinstance(v, np.ndarray):
        if v.size <= 8:
            return "[" + ", ".join(str(x) for x in v.tolist()) + "]"
        return f"[{v.size} x {v.dtype}: {', '.join(str(x) for x in v[:4].tolist())}, ...]"
    if isinstance(v, list):
        return f"[{len(v)} items]" if len(v) > 8 else repr(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


@main.command()
@click.argument("model", required=False)
@friendly_errors
def info(model):
    """Show CPU features, the ISA level and kernels in use, and (with MODEL, a GGUF path or a
    known model name) the
    model's architecture, hyperparameters, tensor types and size."""
    from llmrt import __version__, _core
    from llmrt.gguf import GGUFFile, describe

    from llmrt.hub import resolve_model

    d = None
    if model is not None:   # parse first: a bad file gives its one error line and nothing else
        with GGUFFile(resolve_model(model, download=False)) as f:
            d = describe(f)
    feats = _core.cpu_features()
    _, capped_from, bad_env = _core.cpu_init()   # honours LLMRT_ISA; refills the kernel table
    env = os.environ.get("LLMRT_ISA")
    click.echo(f"llmrt {__version__}")
    click.echo("cpu features: " + (" ".join(k for k, v in feats.items() if v) or "(none)"))
    click.echo(f"isa max: {_core.isa_max_supported()}")
    note = ""
    if bad_env:
        note = f" (LLMRT_ISA={env!r} is not a known level; expected one of " \
               f"{', '.join(_core.ISA_NAMES)})"
    elif capped_from:
        note = f" (LLMRT_ISA={env} asks for {capped_from}, which this CPU lacks)"
    elif env:
        note = f" (LLMRT_ISA={env})"
    click.echo(f"isa in use: {_core.isa_current()}{note}")
    # one row per type, one column per kernel-table entry ("-": no kernel for that type)
    kn = _core.kernel_names()
    tables = list(kn)
    types = list(dict.fromkeys(t for per_type in kn.values() for t in per_type))
    rows = [["type"] + tables] + [[t] + [kn[tb].get(t, "-") for tb in tables] for t in types]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    click.echo("kernels:" + ("" if types else " (none registered)"))
    for r in rows if types else []:
        click.echo("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())

    if d is None:
        return
    click.echo(f"model: {d['path']}")
    click.echo(f"  architecture: {d['architecture'] or '(none: general.architecture missing)'}")
    if d["name"]:
        click.echo(f"  name: {d['name']}")
    click.echo(f"  file: {d['file_size'] / 1e6:.1f} MB, GGUF v{d['version']}, "
               f"{d['n_tensors']} tensors, {d['n_kv']} metadata keys"
               + (f", file type {d['file_type']}" if d["file_type"] else ""))
    click.echo(f"  params: {d['n_params'] / 1e6:.1f} M ({d['n_params']}), "
               f"{d['bits_per_weight']:.2f} bits/weight")
    click.echo("  tensor types: " + ", ".join(f"{t} x{n}" for t, n in d["tensor_types"].items()))
    tok = d["tokenizer_model"] or "(none)"
    if d["tokenizer_pre"]:
        tok += f" (pre {d['tokenizer_pre']})"
    click.echo(f"  tokenizer: {tok}, vocab {d['vocab_size']}, "
               f"chat template: {'yes' if d['chat_template'] else 'no'}")
    click.echo("  hparams:")
    for k, v in d["hparams"].items():
        click.echo(f"    {k} = {_fmt_hparam(v)}")


# ---- chat / generate ----------------------------------------------------------------------------
# Sampling flags follow llama.cpp's names and defaults. The model is a GGUF path or a known name
# (llmrt.hub: smollm2-135m-instruct, the default, and gemma3-270m, fetched from PyPI once).

_SAMPLING_OPTIONS = [
    click.option("--temp", "temperature", type=float, default=0.8, show_default=True,
                 help="Temperature; <= 0 is greedy."),
    click.option("--top-k", type=int, default=40, show_default=True,
                 help="Keep the k most likely tokens (<= 0: all)."),
    click.option("--top-p", type=float, default=0.95, show_default=True,
                 help="Nucleus sampling: smallest set with this probability (1: off)."),
    click.option("--min-p", type=float, default=0.05, show_default=True,
                 help="Drop tokens less likely than min-p x the most likely one (0: off)."),
    click.option("--repeat-penalty", type=float, default=1.0, show_default=True,
                 help="Penalty for tokens among the last --repeat-last-n (1: off)."),
    click.option("--repeat-last-n", type=int, default=64, show_default=True,
                 help="How many recent tokens the repeat penalty looks at (-1: all)."),
    click.option("--seed", type=int, default=None, help="Sampling seed (default: random)."),
    click.option("-c", "--ctx-size", type=int, default=None,
                 help="Context size in tokens (default: the model's)."),
    click.option("-t", "--threads", type=int, default=None,
                 help="Threads (default: the number of physical cores)."),
]


def _sampling_options(fn):
    for opt in reversed(_SAMPLING_OPTIONS):
        fn = opt(fn)
    return fn


def _log(msg: str) -> None:
    click.echo(f"llmrt: {msg}", err=True)


def _load_model(name, threads, ctx_size):
    """Resolve `name` (path, known name or None) and load it; logs what was picked."""
    from llmrt.hub import resolve_model
    from llmrt.model import Model

    try:
        path = resolve_model(name)
    except RuntimeError as e:          # download failed: the message says what to run by hand
        raise ValueError(str(e)) from None
    _log(f"model: {path}")
    kw = {"n_threads": threads} if threads else {}
    if ctx_size:
        kw["ctx_size"] = ctx_size
    model = Model(path, **kw)
    arch = (getattr(model, "metadata", None) or {}).get("general.architecture", "?")
    from llmrt import _core
    _log(f"loaded: arch {arch}, n_vocab {model.n_vocab}, n_ctx {model.n_ctx}; "
         f"isa {_core.isa_current()}, threads {getattr(model, 'n_threads', threads)}, "
         f"kv cache {getattr(model, 'kv_dtype', '?')}")
    return model


def _read_turns(interactive: bool):
    """User lines: from a `> ` prompt on a terminal (Ctrl-C or EOF there ends the session),
    else one line of stdin per turn, no prompt."""
    if not interactive:
        for line in sys.stdin:
            yield line.rstrip("\r\n")
        return
    try:
        import readline  # noqa: F401 -- importing it gives input() line editing and history
    except ImportError:
        pass
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            click.echo()
            return
        yield line


@main.command()
@click.argument("model", required=False)
@click.option("-s", "--system", default=None, help="System prompt.")
@click.option("-n", "--n-predict", type=int, default=-1, show_default=True,
              help="Max tokens per answer (-1: until the end of the turn).")
@click.option("--chat-template", default=None, metavar="FILE",
              help="Jinja chat template file (or a built-in: chatml, gemma, llama2, llama3) "
                   "instead of the model's.")
@_sampling_options
@friendly_errors
def chat(model, system, n_predict, chat_template, threads, ctx_size, **sampling):
    """Chat with MODEL (default: smollm2-135m-instruct). Answers stream as they are generated;
    /reset starts over, /quit or /exit (or EOF) leaves, Ctrl-C stops an answer. With stdin
    not a terminal, each line is one user turn and nothing but the answers is printed."""
    from llmrt.chat import ChatSession
    from llmrt.streamers import TextStreamer

    interactive = sys.stdin.isatty()
    m = _load_model(model, threads, ctx_size)
    cs = ChatSession(m, system=system, template=chat_template, max_new_tokens=n_predict,
                     **sampling)
    _log(f"chat template: {cs.template.name}")
    _log(f"sampling: {cs.sampler!r}")
    if interactive:
        click.echo("Chat: /reset starts over, /quit exits, Ctrl-C stops an answer.")
    streamer = TextStreamer(m.tokenizer, skip_prompt=True)
    for line in _read_turns(interactive):
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/quit", "/exit"):
            break
        if cmd == "/reset":
            cs.reset()
            if interactive:
                click.echo("(conversation cleared)")
            continue
        try:
            cs.send(line, streamer=streamer)
        except KeyboardInterrupt:
            _log("answer interrupted")
        except ValueError as e:        # e.g. context full: on a terminal the session goes on
            if not interactive:
                raise
            _log(f"error: {e} (/reset starts over)")


@main.command()
@click.argument("model", required=False)
@click.option("-p", "--prompt", default=None, help="The prompt.")
@click.option("-f", "--file", "prompt_file", default=None, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False), help="Read the prompt from FILE.")
@click.option("-n", "--n-predict", type=int, default=256, show_default=True,
              help="Tokens to generate (-1: until an end-of-generation token).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at end-of-generation tokens.")
@click.option("--stop", multiple=True, metavar="TEXT",
              help="Stop before this text (repeatable); it is not printed.")
@_sampling_options
@friendly_errors
def generate(model, prompt, prompt_file, n_predict, ignore_eos, stop, threads, ctx_size,
             **sampling):
    """Continue a prompt (-p PROMPT or -f FILE) with MODEL and stream the continuation."""
    import time

    from llmrt.generation import decode, make_sampler, prefill
    from llmrt.streamers import TextStreamer

    if (prompt is None) == (prompt_file is None):
        raise click.UsageError("give exactly one of -p PROMPT or -f FILE")
    if prompt is None:
        with open(prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    m = _load_model(model, threads, ctx_size)
    sampler = make_sampler(**sampling)
    _log(f"sampling: {sampler!r}")
    ids = m.tokenizer.encode(prompt, add_special=True, parse_special=True)
    sess = m.new_session()
    streamer = TextStreamer(m.tokenizer, skip_prompt=True)
    t0 = time.perf_counter()
    logits = prefill(sess, ids)
    t1 = time.perf_counter()
    streamer.put(ids)
    try:
        res = decode(sess, logits, m.tokenizer, sampler, list(ids), streamer=streamer,
                     max_new_tokens=n_predict, stop=stop, ignore_eos=ignore_eos)
    except KeyboardInterrupt:
        _log("interrupted")
        sys.exit(130)
    t2 = time.perf_counter()
    n = len(res.ids)
    _log(f"prompt {len(ids)} tokens in {t1 - t0:.2f} s ({len(ids) / max(t1 - t0, 1e-9):.1f} t/s), "
         f"generated {n} in {t2 - t1:.2f} s ({n / max(t2 - t1, 1e-9):.1f} t/s), "
         f"stop: {res.finish_reason}")
