"""Exceptions raised by llmrt."""


class ModelFormatError(ValueError):
    """A model file is missing, malformed, truncated or uses something llmrt does not support.

    The message says what is wrong and where (file, offset, key or tensor name)."""
