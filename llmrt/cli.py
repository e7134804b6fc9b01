"""llmrt command line: `llmrt info|chat|generate|...`.

Every command turns expected failures (bad model file, bad arguments) into one clear line on
stderr and a non-zero exit code; no traceback.
"""
import functools
import os
import re
import sys
import threading

import click

from llmrt.atomic import writable_target
from llmrt.checks import decode_utf8, read_utf8
from llmrt.errors import ModelFormatError


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as an interrupt so that what a command does on Ctrl-C (end an
    answer cleanly, save `chat --session`, remove a temporary file) happens for them too; the
    command then exits 128 + the signal's number, as a process killed by it would."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def friendly_errors(fn):
    """Print `error: ...` (one line) and exit 1 on expected failures instead of a traceback;
    SIGTERM / SIGHUP become Terminated (see there); a closed stdout (`| head`) ends quietly."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import signal
        before = {}
        if threading.current_thread() is threading.main_thread():
            before = {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:             # the reader went away: nothing more to say to it
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            sys.exit(141)                   # 128 + SIGPIPE, as a tool killed by it
        except (ModelFormatError, FileNotFoundError, ValueError, OSError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except MemoryError as e:            # e.g. a context or thread count the machine cannot hold
            click.echo(f"error: out of memory: {e}" if str(e) else "error: out of memory", err=True)
            sys.exit(1)
        except OverflowError as e:
            click.echo(f"error: a value is too large: {e}", err=True)
            sys.exit(1)
        except Terminated as e:
            click.echo(f"terminated ({signal_name(e.signum)})", err=True)
            sys.exit(128 + e.signum)
        except KeyboardInterrupt:           # Ctrl-C: every command exits the same way
            click.echo("interrupted", err=True)
            sys.exit(130)
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
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
    ex = d.get("experts")
    if ex:
        shared = f"a shared expert (ffn {ex['shared_ffn']})" if ex["shared_ffn"] else "no shared expert"
        click.echo(f"  experts: {ex['count']}, {ex['used']} used per token, {shared}; "
                   f"{ex['active_params'] / 1e6:.1f} M params active per token")
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

_THREADS_OPTION = click.option("-t", "--threads", type=click.IntRange(0, 1024), default=None,
                              help="Threads (default: the number of physical cores).")

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
    click.option("-l", "--logit-bias", "logit_bias", multiple=True, metavar="ID(+|-)BIAS",
                 callback=lambda ctx, param, v: _parse_logit_bias(v),
                 help="Add BIAS to token ID's logit (llama.cpp's): e.g. 15043+1, 15043-inf bans it; "
                      "repeatable."),
    click.option("-c", "--ctx-size", type=int, default=None,
                 help="Context size in tokens (default: the model's)."),
    _THREADS_OPTION,
]


_CACHE_OPTIONS = [
    click.option("--n-keep", "--keep", "n_keep", default=None, metavar="N|auto",
                 help="Tokens pinned at the start of the streaming KV cache (attention sinks): "
                      "an integer, or auto = BOS plus the system prompt [chat: auto, "
                      "generate: 4]."),
    click.option("--n-discard", type=int, default=-1, show_default=True,
                 help="Tokens evicted after the pinned ones when the cache is full "
                      "(-1: half of the unpinned ones)."),
    click.option("--kv-mode", type=click.Choice(["shift", "recompute", "window", "none"]),
                 default="shift", show_default=True,
                 help="On eviction: shift-RoPE the kept keys (shift), re-evaluate the kept tokens "
                      "(recompute), shift without sinks (window), or stop with an error (none)."),
]


def _options(opts):
    """A decorator applying click options in the order listed."""
    def apply(fn):
        for opt in reversed(opts):
            fn = opt(fn)
        return fn
    return apply


# Weight-only quantization at load (F32/F16/BF16 models; llmrt/wquant.py), on every command that
# loads a model. The decorator hands them to the command as one dict, `wq`.
_WQ_OPTIONS = [
    click.option("--weight-dtype", type=click.Choice(["int4", "int8"]), default=None,
                 help="Quantize the matmul weights of an F32/F16/BF16 model at load."),
    click.option("--group-size", type=click.Choice(["32", "64", "128", "-1"]), default=None,
                 help="Elements per quantization group, -1: per output channel [32]."),
    click.option("--scheme", type=click.Choice(["sym", "asym"]), default=None,
                 help="Symmetric (scale) or asymmetric (scale + min) groups [sym]."),
    click.option("--compute-dtype", type=click.Choice(["int8", "fp32", "bf16"]), default=None,
                 help="Activations in the matmuls: int8 blocks, f32, or rounded to bf16 [int8]."),
    click.option("--rounding", type=click.Choice(["imatrix", "search", "minmax"]), default=None,
                 help="int4 scales: searched for the least error weighted by a calibration "
                      "pass's activations (imatrix), unweighted (search), or min/max as ggml's "
                      "reference quantizer [imatrix]."),
    click.option("--quantize-output/--no-quantize-output", default=None,
                 help="int4: quantize the output head to int4 too (default: it is kept int8)."),
]


def _wq_options(fn):
    """Adds the _WQ_OPTIONS and passes them to fn as wq={weight_dtype, group_size, ...}."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        wq = {k: kwargs.pop(k) for k in ("weight_dtype", "group_size", "scheme", "compute_dtype",
                                         "rounding", "quantize_output")}
        if wq["group_size"] is not None:
            wq["group_size"] = int(wq["group_size"])
        return fn(*args, wq=wq, **kwargs)
    return _options(_WQ_OPTIONS)(wrapper)


_cache_options = _options(_CACHE_OPTIONS)
_sampling_options = _options(_SAMPLING_OPTIONS)


def _parse_logit_bias(values):
    """-l/--logit-bias values "ID+BIAS" / "ID-BIAS" (BIAS a number or inf) -> {id: bias}, or None."""
    out = {}
    for v in values:
        m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*", v)
        if m is None:
            raise click.BadParameter(f"{v!r} is not ID+BIAS or ID-BIAS (e.g. 15043+1, 15043-inf)",
                                     param_hint="--logit-bias")
        bias = float(m.group(3)) * (1 if m.group(2) == "+" else -1)
        if bias == float("inf"):
            raise click.BadParameter(f"{v!r}: +inf would make the token the only choice; use a large "
                                     "finite bias", param_hint="--logit-bias")
        out[int(m.group(1))] = bias
    return out or None


def _int_or_auto(value, minimum: int, hint: str):
    """A flag that takes "auto" or an integer >= minimum."""
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"expected an integer or 'auto', got {value!r}", param_hint=hint) from None
    if n < minimum:
        raise click.BadParameter(f"must be >= {minimum} or 'auto', got {n}", param_hint=hint)
    return n


def _parse_keep(value, default):
    """--n-keep: None -> default; "auto"; or a non-negative integer."""
    return default if value is None else _int_or_auto(value, 0, "--n-keep")


def _parse_prefill_chunk(value):
    """--prefill-chunk: "auto" -> None (the engine sizes it); or a positive integer."""
    n = _int_or_auto(value, 1, "--prefill-chunk")
    return None if n == "auto" else n


def _log(msg: str) -> None:
    click.echo(f"llmrt: {msg}", err=True)


def _load_model(name, threads, ctx_size, wq=None):
    """Resolve `name` (path, known name or None) and load it (quantizing its weights at load when
    wq["weight_dtype"] is set); logs what was picked."""
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
    kw.update({k: v for k, v in (wq or {}).items() if v is not None})
    model = Model(path, **kw)
    if getattr(model, "wq", None) is not None:
        _log(model.wq_summary)
    arch = (getattr(model, "metadata", None) or {}).get("general.architecture", "?")
    from llmrt import _core
    hp = getattr(model, "hparams", None)
    if getattr(hp, "n_expert", 0):      # mixture of experts: what each token runs
        arch += f" ({hp.n_expert} experts, {hp.n_expert_used} per token" + \
                (", shared expert)" if hp.n_ff_shexp else ")")
    _log(f"loaded: arch {arch}, n_vocab {model.n_vocab}, n_ctx {model.n_ctx}; "
         f"isa {_core.isa_current()}, threads {getattr(model, 'n_threads', threads)}, "
         f"kv cache {getattr(model, 'kv_dtype', '?')}")
    return model


def _log_cache(sess, keep) -> None:
    """One line: the streaming cache's mode, ctx, n_keep, n_discard."""
    describe = getattr(sess, "describe", None)
    if describe is None:
        return
    line = describe()
    if keep == "auto":
        line = line.replace(f"n_keep {sess.n_keep}", "n_keep auto (BOS + system prompt)")
    _log(line)


def _given_on_command_line() -> set:
    """The current command's parameters given on its command line (not defaults)."""
    from click.core import ParameterSource
    ctx = click.get_current_context()
    return {p for p in ctx.params if ctx.get_parameter_source(p) is ParameterSource.COMMANDLINE}


def utf8_text(text: str, what: str) -> str:
    """`text` from argv or stdin, which Python decodes with surrogateescape: a byte that is not
    UTF-8 arrives as a lone surrogate, and the tokenizer's error would name a UTF-16 surrogate
    at a character of the rendered prompt. The bytes back, checked by decode_utf8 instead."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        decode_utf8(text.encode("utf-8", "surrogateescape"), what)   # raises, naming the byte
    return text


def signal_name(signum: int) -> str:
    import signal
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
        except Terminated:
            raise
        except (EOFError, KeyboardInterrupt):
            click.echo()
            return
        yield line


@main.command()
@click.argument("model", required=False)
@click.option("-s", "--system", default=None, help="System prompt.")
@click.option("-n", "--n-predict", type=click.IntRange(-1), default=-1, show_default=True,
              help="Max tokens per answer (-1: until the end of the turn).")
@click.option("--chat-template", default=None, metavar="FILE",
              help="Jinja chat template file (or a built-in: chatml, gemma, llama2, llama3) "
                   "instead of the model's.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop answers at end-of-generation tokens.")
@click.option("--session", "session_path", default=None, metavar="PATH",
              help="Session file: the conversation is loaded from it if it exists and saved to it "
                   "on exit (as llama.cpp's --prompt-cache, with the streaming cache's state).")
@_cache_options
@_sampling_options
@_wq_options
@friendly_errors
def chat(model, system, n_predict, chat_template, ignore_eos, session_path, n_keep, n_discard, kv_mode,
         threads, ctx_size, wq, **sampling):
    """Chat with MODEL (default: smollm2-135m-instruct). Answers stream as they are generated;
    /reset starts over, /save PATH and /load PATH save and restore the conversation, /quit or
    /exit (or EOF) leaves, Ctrl-C stops an answer. With stdin not a terminal, each line is one
    user turn and nothing but the answers is printed."""
    from llmrt.chat import ChatSession
    from llmrt.streamers import TextStreamer

    interactive = sys.stdin.isatty()
    if system is not None:
        utf8_text(system, "-s SYSTEM")
    m = _load_model(model, threads, ctx_size, wq)
    keep = _parse_keep(n_keep, "auto")
    if session_path is not None:
        writable_target(session_path)   # before the conversation, not when it is saved at exit
    if session_path is not None and os.path.exists(session_path):
        cs = ChatSession.load(session_path, m)      # a bad file: one error line, nothing lost
        _log(f"session: loaded {session_path} ({len(cs.messages)} messages, "
             f"{cs.session.n_past} tokens cached)")
        _apply_given_options(cs, n_predict=n_predict, ignore_eos=ignore_eos, sampling=sampling)
    else:
        cs = ChatSession(m, system=system, template=chat_template, max_new_tokens=n_predict,
                         n_keep=keep, n_discard=n_discard,
                         kv_mode=None if kv_mode == "shift" else kv_mode, ignore_eos=ignore_eos,
                         **sampling)
    _log_cache(cs.session, keep)
    _log(f"chat template: {cs.template.name}")
    _log(f"sampling: {cs.sampler!r}")
    if interactive:
        click.echo("Chat: " + CHAT_HELP)
    streamer = TextStreamer(m.tokenizer, skip_prompt=True)
    try:
        _chat_loop(cs, m, streamer, interactive)
    finally:
        if session_path is not None:
            n = cs.save(session_path)
            _log(f"session: saved {session_path} ({n / 1e6:.1f} MB)")


def _apply_given_options(cs, *, n_predict, ignore_eos, sampling):
    """A loaded chat session keeps its conversation; the options given on this command line for
    the answers to come apply to them (as llama.cpp's with --prompt-cache): -n, --ignore-eos and
    the sampling flags. Those that shape the conversation itself (-s, --chat-template, -c,
    --n-keep, --n-discard, --kv-mode) cannot change: a warning names the ones given."""
    from llmrt.generation import make_sampler

    ctx = click.get_current_context()
    given = _given_on_command_line()
    if "n_predict" in given:
        cs.max_new_tokens = n_predict
    if "ignore_eos" in given:
        cs.ignore_eos = ignore_eos
    if given & set(sampling):
        cs.sampler = make_sampler(n_vocab=cs.model.n_vocab, **sampling)
    sess = cs.session
    kept = {"system": cs.system, "ctx_size": sess.n_ctx, "n_discard": getattr(sess, "n_discard", None),
            "kv_mode": getattr(sess, "kv_mode", None), "n_keep": cs.n_keep}
    fixed = sorted(p for p in given & {"system", "chat_template", "ctx_size", "n_keep", "n_discard", "kv_mode"}
                   if p == "chat_template" or str(ctx.params[p]) != str(kept[p]))
    if fixed:
        names = {"system": "-s", "chat_template": "--chat-template", "ctx_size": "-c", "n_keep": "--n-keep",
                 "n_discard": "--n-discard", "kv_mode": "--kv-mode"}
        _log(f"warning: {', '.join(names[p] for p in fixed)} ignored: the loaded session keeps its "
             "conversation's (start a new session file to change them)")


CHAT_HELP = ("/reset starts over, /save PATH and /load PATH keep a conversation, /quit exits, "
             "/help shows this, Ctrl-C stops an answer.")


def _chat_loop(cs, m, streamer, interactive):
    from llmrt.chat import ChatSession

    for n_line, line in enumerate(_read_turns(interactive), 1):
        try:
            utf8_text(line, "the input line" if interactive else f"stdin line {n_line}")
        except ValueError as e:         # one bad line: skipped, the conversation goes on
            _log(f"error: {e}: skipped")
            continue
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
        if cmd == "/help":
            if interactive:
                click.echo(CHAT_HELP)
            else:                           # (stdout holds the answers only)
                _log(CHAT_HELP)
            continue
        if cmd.split(maxsplit=1)[0] in ("/save", "/load"):
            path = cmd[6:].strip()
            try:
                if not path:     # (was sent to the model as a message)
                    raise ValueError(f"{cmd} needs a file: {cmd} PATH")
                if cmd.startswith("/save"):
                    n = cs.save(path)
                    _log(f"session: saved {path} ({n / 1e6:.1f} MB)")
                else:
                    loaded = ChatSession.load(path, m)
                    cs.__dict__.update(loaded.__dict__)     # the caller's cs is now the loaded one
                    _log(f"session: loaded {path} ({len(cs.messages)} messages, "
                         f"{cs.session.n_past} tokens cached)")
            except (ValueError, OSError) as e:
                if not interactive:
                    raise
                _log(f"error: {e} (the conversation goes on unchanged)")
            continue
        try:
            cs.send(line, streamer=streamer)
        except Terminated:              # the answer so far is kept; the session is saved
            raise
        except KeyboardInterrupt:
            _log("answer interrupted")
        except ValueError as e:        # e.g. context full: on a terminal the session goes on
            if not interactive:
                raise
            _log(f"error: {e} (/reset starts over)")


def _new_session(m, n_keep, n_discard, kv_mode):
    """A streaming session; models whose new_session takes no cache arguments (test doubles)
    get a plain one when the defaults are asked for."""
    try:
        return m.new_session(n_keep=n_keep, n_discard=n_discard, kv_mode=kv_mode)
    except TypeError:
        if (n_keep, n_discard, kv_mode) != (4, -1, "shift"):
            raise
        return m.new_session()


@main.command()
@click.argument("model", required=False)
@click.option("-p", "--prompt", default=None, help="The prompt.")
@click.option("-f", "--file", "prompt_file", default=None, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False), help="Read the prompt from FILE.")
@click.option("-n", "--n-predict", type=click.IntRange(-1), default=256, show_default=True,
              help="Tokens to generate (-1: until an end-of-generation token).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at end-of-generation tokens.")
@click.option("--stop", multiple=True, metavar="TEXT",
              help="Stop before this text (repeatable); it is not printed.")
@click.option("--json", "json_mode", is_flag=True,
              help="JSON mode: the continuation is one JSON object (it ends where the object closes).")
@click.option("-j", "--json-schema", default=None, metavar="SCHEMA",
              help="The continuation is JSON that this JSON Schema accepts (llama.cpp's flag), e.g. "
                   "'{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\"}}}'.")
@click.option("--grammar", default=None, metavar="GBNF",
              help="The continuation matches this GBNF grammar (llama.cpp's format and flag).")
@click.option("--grammar-file", default=None, metavar="FILE", type=click.Path(exists=True, dir_okay=False),
              help="Read the GBNF grammar from FILE (e.g. llama.cpp's grammars/*.gbnf).")
@_cache_options
@_sampling_options
@_wq_options
@friendly_errors
def generate(model, prompt, prompt_file, n_predict, ignore_eos, stop, json_mode, json_schema, grammar,
             grammar_file, n_keep, n_discard, kv_mode, threads, ctx_size, wq, **sampling):
    """Continue a prompt (-p PROMPT or -f FILE) with MODEL and stream the continuation."""
    import time

    import json

    from llmrt.generation import decode, make_sampler, output_constraint, prefill
    from llmrt.grammar import gbnf_grammar
    from llmrt.jsonmode import parse_response_format
    from llmrt.model import N_BATCH
    from llmrt.progress import Progress
    from llmrt.streamers import TextStreamer

    if (prompt is None) == (prompt_file is None):
        raise click.UsageError("give exactly one of -p PROMPT or -f FILE")
    if prompt is None:
        prompt = read_utf8(prompt_file)
    else:
        utf8_text(prompt, "-p PROMPT")
    given = [f for f, v in (("--json", json_mode), ("--json-schema", json_schema), ("--grammar", grammar),
                            ("--grammar-file", grammar_file)) if v]
    if len(given) > 1:
        raise click.UsageError(f"give one of --json, --json-schema, --grammar, --grammar-file, not {' and '.join(given)}")
    fmt = {"type": "json_object"} if json_mode else None
    if json_schema is not None:
        try:
            fmt = {"type": "json_schema", "json_schema": {"schema": json.loads(json_schema)}}
            parse_response_format(fmt)          # (a schema llmrt cannot take: before the model loads)
        except ValueError as e:                 # (json.JSONDecodeError is one)
            raise click.BadParameter(str(e), param_hint="'-j' / '--json-schema'") from None
    if grammar_file is not None:
        grammar = read_utf8(grammar_file)
    if grammar is not None:
        try:
            grammar = gbnf_grammar(grammar)     # (a syntax error: before the model loads)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--grammar-file'" if grammar_file else "'--grammar'") from None
    m = _load_model(model, threads, ctx_size, wq)
    sampler = make_sampler(n_vocab=m.n_vocab, **sampling)    # (checked before the prompt runs)
    _log(f"sampling: {sampler!r}")
    ids = m.tokenizer.encode(prompt, add_special=True, parse_special=True)
    keep = _parse_keep(n_keep, 4)
    if keep == "auto":                 # no system prompt here: BOS if the prompt has one
        bos = getattr(m.tokenizer, "bos_id", None)
        keep = 1 if ids and bos is not None and ids[0] == bos else 4
    sess = _new_session(m, keep, n_discard, kv_mode)
    _log_cache(sess, None)
    streamer = TextStreamer(m.tokenizer, skip_prompt=True)
    t0 = time.perf_counter()
    # a bar for a long prompt (a file of many pages prefills for minutes on a big model)
    bar = ((lambda n: Progress(total=n, desc="prompt", unit="tok"))
           if len(ids) > 2 * N_BATCH else None)
    logits = prefill(sess, ids, progress=bar)
    t1 = time.perf_counter()
    streamer.put(ids)
    res = decode(sess, logits, m.tokenizer, sampler, list(ids), streamer=streamer,
                 max_new_tokens=n_predict, stop=stop, ignore_eos=ignore_eos,   # Ctrl-C: 130
                 constraint=output_constraint(m.tokenizer, fmt, grammar))
    t2 = time.perf_counter()
    n = len(res.ids)
    _log(f"prompt {len(ids)} tokens in {t1 - t0:.2f} s ({len(ids) / max(t1 - t0, 1e-9):.1f} t/s), "
         f"generated {n} in {t2 - t1:.2f} s ({n / max(t2 - t1, 1e-9):.1f} t/s), "
         f"stop: {res.finish_reason}")


# ---- perplexity ---------------------------------------------------------------------------------
# Default: llama-perplexity's protocol (llmrt/perplexity.py), so the numbers compare with
# llama.cpp's. With --kv-mode: StreamingLLM's evaluation through the streaming cache.

@main.command()
@click.argument("model")
@click.option("-f", "--file", "text_file", required=True, metavar="FILE",
              help="Text to score (UTF-8; one trailing newline is dropped, as llama.cpp does).")
@click.option("-c", "--ctx-size", type=int, default=512, show_default=True,
              help="Chunk size (dense) or cache size (--kv-mode) in tokens.")
@click.option("--max-tokens", type=int, default=None,
              help="Score only the first N tokens of the text.")
@click.option("--kv-mode", type=click.Choice(["shift", "recompute", "window"]), default=None,
              help="Stream the text through the streaming cache with this eviction mode "
                   "(default: llama-perplexity's chunks, no eviction).")
@click.option("--n-keep", "--keep", "n_keep", type=int, default=4, show_default=True,
              help="--kv-mode: attention-sink tokens kept at the start of the cache.")
@click.option("--n-discard", type=int, default=-1, show_default=True,
              help="--kv-mode: cells evicted when the cache is full (-1: half of the rest).")
@click.option("--batch", "batch", type=int, default=1, show_default=True,
              help="--kv-mode: tokens per evaluation (1: token by token, as StreamingLLM).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object with the results as the last line.")
@click.option("--nll-csv", default=None, metavar="FILE", help="Write position,token,nll to FILE.")
@click.option("--plot", default=None, metavar="FILE.png",
              help="Draw NLL over position to FILE.png (needs matplotlib: llmrt[plot]).")
@_THREADS_OPTION
@_wq_options
@friendly_errors
def perplexity(model, text_file, ctx_size, max_tokens, kv_mode, n_keep, n_discard, batch,
               as_json, nll_csv, plot, threads, wq):
    """Perplexity of MODEL on the text of FILE.

    By default llama-perplexity's protocol: chunks of --ctx-size tokens, each from an empty
    cache with BOS first (when the model adds BOS), NLL over the second half of each chunk.
    With --kv-mode the whole text streams through one cache of --ctx-size cells that evicts
    as it goes, and every token after the first is scored."""
    import json

    from llmrt import perplexity as ppl_mod

    if kv_mode is None:     # options of the streamed evaluation were ignored without it
        given = [f"--{name.replace('_', '-')}" for name in ("n_keep", "n_discard", "batch")
                 if name in _given_on_command_line()]
        if given:
            raise click.UsageError(f"{', '.join(given)} only apply with --kv-mode (the default "
                                   "dense evaluation has no eviction and scores chunk by chunk)")
    if not os.path.exists(text_file):       # (a pipe, <(cmd), is read as a file is)
        raise FileNotFoundError(f"no such file: {text_file}")
    if os.path.isdir(text_file):
        raise ValueError(f"{text_file} is a directory, not a text file")
    if plot:   # fail before the long run, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("--plot needs matplotlib: pip install 'llmrt[plot]' "
                             "(or pip install matplotlib)") from None
    for out in (nll_csv, plot):     # likewise: an output that cannot be written
        if out:
            writable_target(out)
    text = ppl_mod.read_text(text_file)
    if ctx_size is None or ctx_size < 1:
        raise ValueError(f"ctx-size must be >= 1, got {ctx_size}")
    m = _load_model(model, threads, ctx_size, wq)
    ids = m.tokenizer.encode(text, add_special=True, parse_special=False)
    _log(f"text: {text_file}: {len(text)} characters, {len(ids)} tokens"
         + (f" (scoring the first {max_tokens})" if max_tokens else ""))
    if kv_mode:
        _log(f"streaming: kv-mode {kv_mode}, ctx-size {ctx_size}, n-keep "
             f"{0 if kv_mode == 'window' else n_keep}, n-discard {n_discard}, "
             f"{batch} token(s) per eval")
    try:
        r = ppl_mod.perplexity(m, ids, ctx_size, kv_mode=kv_mode, n_keep=n_keep,
                               n_discard=n_discard, batch=batch, max_tokens=max_tokens)
    except ppl_mod.PerplexityInterrupted as e:     # Ctrl-C: what was scored is not lost
        if e.result is not None:
            _print_ppl(e.result, "Estimate so far")
            if nll_csv:
                ppl_mod.write_nll_csv(e.result, nll_csv)
                _log(f"per-token NLL so far written to {nll_csv}")
        raise e.interrupt or e          # Ctrl-C: 130; SIGTERM / SIGHUP: 128 + the signal
    _print_ppl(r, "Final estimate")
    if nll_csv:
        ppl_mod.write_nll_csv(r, nll_csv)
        _log(f"per-token NLL written to {nll_csv}")
    if plot:
        ppl_mod.plot_nll(r, plot, title=f"{os.path.basename(m.path)}: {r.mode}, ctx {r.ctx_size}"
                         + (f", n_keep {r.n_keep}" if r.n_keep is not None else "")
                         + f": ppl {r.ppl:.3f}")
        _log(f"plot written to {plot}")
    if as_json:
        d = r.summary()
        d.update(model=m.path, file=text_file)
        click.echo(json.dumps(d))


def _print_ppl(r, what: str) -> None:
    if r.mode == "dense":
        click.echo(",".join(f"[{i + 1}]{p:.4f}" for i, p in enumerate(r.running)))
    click.echo(f"{what}: PPL = {r.ppl:.4f} +/- {r.ppl_err:.5f}  "
               f"({r.n_tokens} tokens scored, {r.mode}, ctx {r.ctx_size}, {r.seconds:.1f} s)")
    if r.n_evicted is not None:
        _log(f"cells evicted: {r.n_evicted}")


# ---- bench --------------------------------------------------------------------------------------

@main.command()
@click.argument("model", required=False)
@click.option("-p", "--n-prompt", type=click.IntRange(0), default=512, show_default=True,
              help="Prompt test: this many random tokens in one batch (0: skip).")
@click.option("-n", "--n-gen", type=click.IntRange(0), default=128, show_default=True,
              help="Generation test: this many tokens decoded one at a time (0: skip).")
@click.option("-d", "--n-depth", type=click.IntRange(0), default=0, show_default=True,
              help="Each test starts from a cache already holding this many random tokens "
                   "(prefilled untimed): pp512 @ d1024, tg128 @ d1024, as llama-bench.")
@click.option("-r", "--repetitions", type=click.IntRange(1), default=5, show_default=True,
              help="Timed repetitions of each test (after one warm-up run).")
@click.option("-o", "--output", type=click.Choice(["md", "json"]), default="md", show_default=True,
              help="A markdown table (as llama-bench) or one JSON list.")
@click.option("--bandwidth/--no-bandwidth", default=True, show_default=True,
              help="Also measure memory read bandwidth and report tg as a fraction of the bound.")
@click.option("--profile", is_flag=True,
              help="Also time every graph node and print where each test's time goes, by op.")
@_THREADS_OPTION
@_wq_options
@friendly_errors
def bench(model, n_prompt, n_gen, n_depth, repetitions, output, bandwidth, profile, threads, wq):
    """Benchmark MODEL as llama-bench does: pp<P> (prompt processing, t/s) and tg<N> (decoding,
    t/s), mean ± sd over the repetitions."""
    import json
    import time

    from llmrt import bench as bench_mod
    from llmrt import hub, model as _model  # noqa: F401  (the library is imported before the clock
    from llmrt.progress import Progress     # starts, as llamacpp_bench.py imports llama_cpp first)

    if n_prompt == 0 and n_gen == 0:   # before the load, as the ranges above
        raise click.UsageError("nothing to measure: give -p or -n a length > 0")
    t0 = time.perf_counter()
    m = _load_model(model, threads, n_depth + max(n_prompt, n_gen, 1), wq)
    m._graph(1, False)                 # weights repacked here (the first graph): part of loading
    load_s = time.perf_counter() - t0
    n_runs = repetitions * ((n_prompt > 0) + (n_gen > 0))
    with Progress(total=n_runs, desc="bench") as bar:
        results = bench_mod.run(m, n_prompt, n_gen, repetitions, progress=bar.update,
                                profile=profile, n_depth=n_depth)
    # (at a depth the cache's reads add to the weights': no bound, see llmrt/bench.py)
    bound = bench_mod.bandwidth_bound(m) if bandwidth and n_gen > 0 and n_depth == 0 else None
    name = os.path.basename(m.path)
    if output == "json":
        rows = []
        for r in results:
            d = {"test": r.test, "t_s": r.t_s, "t_s_sd": r.t_s_sd, "n_threads": r.n_threads,
                 "isa": r.isa, "model": name, "load_s": load_s, "n_depth": r.n_depth,
                 "samples": r.samples}
            if profile:
                d["profile"] = r.profile
            if bound is not None and r.test.startswith("tg"):
                d.update(read_bandwidth_gb_s=bound["read_bandwidth_gb_s"],
                         weight_bytes_per_token=bound["weight_bytes_per_token"],
                         tg_bound_t_s=bound["tg_bound_t_s"],
                         bound_fraction=r.t_s / bound["tg_bound_t_s"])
            rows.append(d)
        click.echo(json.dumps(rows))
        return
    click.echo(bench_mod.format_markdown(results, os.path.getsize(m.path), name))
    click.echo(f"\nload: {load_s:.2f} s")
    if bandwidth and n_gen > 0 and n_depth > 0:
        click.echo(f"decode bandwidth bound: not given at depth {n_depth} (the cache's reads add to the "
                   f"weights', by each layer's window); run -d 0 for it")
    if bound is not None:
        tg = next(r for r in results if r.test.startswith("tg"))
        click.echo(f"decode bandwidth bound: {bound['weight_bytes_per_token'] / 1e6:.1f} MB of weights "
                   f"per token / {bound['read_bandwidth_gb_s']:.1f} GB/s read ({bound['n_threads']} "
                   f"threads) = {bound['tg_bound_t_s']:.1f} t/s; {tg.test} reaches "
                   f"{100 * tg.t_s / bound['tg_bound_t_s']:.0f} % of it")
    if profile:
        for r in results:
            click.echo("\n" + bench_mod.format_profile(r))

@main.command()
@click.argument("input_path", metavar="IN.gguf")
@click.argument("output_path", metavar="OUT.gguf")
@click.argument("qtype", metavar="TYPE", type=click.Choice(
    ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
     "q3_k_m", "q4_k_m", "q5_k_m"], case_sensitive=False))
@_THREADS_OPTION
@friendly_errors
def quantize(input_path, output_path, qtype, threads):
    """Quantize IN.gguf (F32/F16/BF16) to TYPE and write OUT.gguf, choosing each tensor's type
    as llama-quantize does (the output tensor Q6_K, norms F32, q4_k = Q4_K_M, ...; llama.cpp's
    names q3_k_m, q4_k_m, q5_k_m are the same as q3_k, q4_k, q5_k). SIGINT, SIGTERM or SIGHUP
    stop it leaving OUT as it was (no partial file: friendly_errors turns SIGTERM / SIGHUP into
    the interrupt that unwinds through the temporary file's removal, then exits 128 + signal)."""
    from llmrt.model import physical_core_count
    from llmrt.quantize import quantize_file

    if not os.path.isfile(input_path):
        raise FileNotFoundError(f"no such file: {input_path}" if not os.path.isdir(input_path)
                                else f"{input_path} is a directory, not a GGUF file")

    r = quantize_file(input_path, output_path, qtype, n_threads=threads or physical_core_count())
    _log(r.summary())


@main.command()
@click.argument("model", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on.")
@click.option("-np", "--parallel", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Slots: conversations decoded together, each with its own streaming cache.")
@click.option("-c", "--ctx-size", type=int, default=None,
              help="Cells of each slot's streaming cache (default: the model's context).")
@click.option("--n-keep", "--keep", "n_keep", default="auto", show_default=True, metavar="N|auto",
              help="Tokens pinned in a new conversation's cache: an integer, or auto = BOS plus "
                   "the system prompt (at most half the context).")
@click.option("--n-discard", type=int, default=-1, show_default=True,
              help="Tokens evicted after the pinned ones when a slot's cache is full (-1: half).")
@click.option("-b", "--batch-size", "n_batch", type=int, default=256, show_default=True,
              help="Prompt tokens prefilled per step when no other stream is decoding.")
@click.option("--prefill-chunk", default="auto", show_default=True, metavar="N|auto",
              help="Prompt tokens prefilled per step while other streams decode (at most "
                   "--batch-size); auto: about two decode steps' time, at least 16.")
@click.option("-n", "--n-predict", type=click.IntRange(-1), default=-1, show_default=True,
              help="max_tokens of a request that sets none (-1: until end of generation).")
@click.option("--max-queue", type=int, default=64, show_default=True,
              help="Requests that may wait for a slot; more get 503 with Retry-After.")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds a request may wait for a slot (then 503).")
@click.option("--chat-template", default=None, metavar="FILE",
              help="Jinja chat template file (or a built-in: chatml, gemma, llama2, llama3) "
                   "instead of the model's.")
@click.option("-a", "--alias", default=None, help="Model name in the API (default: the file name).")
@click.option("--max-body-bytes", type=int, default=4 << 20, show_default=True,
              help="Largest request body accepted (413 above).")
@click.option("--slot-save-path", default=None, metavar="DIR",
              help="Directory of POST /slots/{id}?action=save|restore files (off without it).")
@click.option("--api-key", "api_keys", multiple=True, metavar="KEY", envvar="LLMRT_API_KEY",
              help="Require this key (Authorization: Bearer KEY) on every route but /health, "
                   "/v1/models and the chat page; repeatable; or LLMRT_API_KEY (space-separated).")
@click.option("--api-key-file", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Also accept the keys in FILE, one per line.")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="Let web pages of ORIGIN (e.g. https://app.example.com; * for any) call the API "
                   "from a browser; repeatable (default: none, same-origin only).")
@click.option("--body-timeout", type=click.FloatRange(0, min_open=True), default=30.0, show_default=True,
              help="Seconds a request body may stall between two parts (then 408).")
@click.option("--ray", "use_ray", is_flag=True,
              help="Run --replicas replicas on Ray Serve behind its HTTP proxy (pip install "
                   "\"llmrt[ray]\"), with conversation affinity (serve_multiplexed_model_id header).")
@click.option("--replicas", type=int, default=2, show_default=True, help="Replicas with --ray.")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="With --ray: join this Ray cluster (e.g. auto) instead of starting a local one.")
@_THREADS_OPTION
@_wq_options
@friendly_errors
def serve(model, host, port, parallel, ctx_size, n_keep, n_discard, n_batch, prefill_chunk, n_predict,
          max_queue, timeout, chat_template, alias, max_body_bytes, slot_save_path, api_keys, api_key_file,
          cors_origins, body_timeout, use_ray, replicas, ray_address, threads, wq):
    """Serve MODEL (default: smollm2-135m-instruct) over an OpenAI-compatible HTTP API:
    /v1/chat/completions, /v1/completions, /v1/models[/ID], /tokenize, /detokenize, /health,
    /metrics, /slots, and a chat page at /. With --api-key, all but /health, /v1/models and the
    page need the key. Needs the serve extra: pip install "llmrt[serve]"."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ValueError(f"llmrt serve needs the serve extra ({e.name} is missing): "
                         f'pip install "llmrt[serve]"') from None
    import logging

    from llmrt.server import listen_sockets
    from llmrt.server import serve as run_server

    keep = _parse_keep(n_keep, "auto")
    chunk = _parse_prefill_chunk(prefill_chunk)
    keys = _api_keys(api_keys, api_key_file)
    if parallel < 1:
        raise click.BadParameter(f"must be >= 1, got {parallel}", param_hint="--parallel")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if use_ray:
        try:
            from llmrt import ray_serve
        except ImportError as e:
            raise ValueError(f"llmrt serve --ray needs the ray extra ({e.name} is missing): "
                             f'pip install "llmrt[ray]"') from None
        if replicas < 1:
            raise click.BadParameter(f"must be >= 1, got {replicas}", param_hint="--replicas")
        if any(v is not None for v in wq.values()) or slot_save_path:
            raise ValueError("--ray runs plain replicas: weight-only quantization flags and "
                             "--slot-save-path are not passed to them")
        from llmrt.hub import resolve_model
        path = resolve_model(model)
        ray_serve.run(path, host=host, port=port, replicas=replicas, address=ray_address, options={
            "threads": threads, "ctx_size": ctx_size, "parallel": parallel, "n_keep": keep,
            "n_discard": n_discard, "n_batch": n_batch, "max_queue": max_queue, "timeout": timeout,
            "n_predict": n_predict, "chat_template": chat_template, "alias": alias, "prefill_chunk": chunk,
            "api_keys": keys, "cors_origins": list(cors_origins), "body_timeout": body_timeout})
        return
    socks = listen_sockets(host, port)      # a busy port fails now, not after the load
    try:
        m = _load_model(model, threads, ctx_size, wq)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    run_server(None, model=m, host=host, port=port, parallel=parallel, ctx_size=ctx_size, n_keep=keep,
               n_discard=n_discard, n_batch=n_batch, max_queue=max_queue, timeout=timeout,
               n_predict=n_predict, chat_template=chat_template, alias=alias,
               max_body_bytes=max_body_bytes, slot_save_path=slot_save_path, prefill_chunk=chunk,
               sockets=socks, api_keys=keys, cors_origins=list(cors_origins), body_timeout=body_timeout)


def _api_keys(given, path) -> list:
    """--api-key values (one key each; LLMRT_API_KEY: space-separated) and --api-key-file's lines
    (blank lines and # comments skipped), in order, each once. An empty value is an error."""
    # stripped, as a header's value is compared (LLMRT_API_KEY: click splits it at whitespace)
    keys = [k.strip() for k in given]
    if not all(keys):           # e.g. --api-key "$KEY" with KEY unset: never a server without one
        raise click.BadParameter("an empty API key", param_hint="--api-key")
    if path is not None:
        try:
            lines = read_utf8(path).splitlines()
        except OSError as e:
            raise ValueError(f"--api-key-file: cannot read {path}: {e.strerror}") from None
        keys += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not keys:
            raise click.BadParameter(f"{path} holds no key", param_hint="--api-key-file")
    for k in keys:
        if len(k) > 4096 or not (k.isascii() and k.isprintable()):   # (what a header carries)
            raise click.BadParameter("an API key must be printable ASCII of at most 4096 characters",
                                     param_hint="--api-key")
    return list(dict.fromkeys(keys))
