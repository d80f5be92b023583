"""The top layer: the `draftsmith` command line, one module per subcommand."""

from typing import Literal

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
"""Precision a command loads its models in (auto: the checkpoint's own)."""
