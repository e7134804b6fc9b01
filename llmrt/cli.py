"""llmrt command line: `llmrt info|chat|generate|...`.

Every command turns expected failures (bad model file, bad arguments) into one clear line on
stderr and a non-zero exit code; no traceback.
"""
import functools
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
