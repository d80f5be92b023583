"""Command-line flags from a typed dataclass, and the dataclass back from the parsed flags.

Each field becomes ``--kebab-case-name`` (a positional argument with ``field(metadata=POSITIONAL)``),
typed by its annotation, defaulting to its default, required when it has none, and helped by its
docstring (`field_docs`). A command keeps an older flag name working with a class attribute
``FLAG_ALIASES = {"do_sample": ("--sample",)}``.

Every numeric field (int or float, alone, optional or in a list) says which values it takes in a
class attribute ``FLAG_RANGES = {"max_new_tokens": at_least(1), "seed": ANY_NUMBER}``; the
parser refuses to build for a numeric field without one, and `from_flags` checks each value
before the dataclass exists (so before any model loads): ``--max-new-tokens must be >= 1, got
-5``. Inherited fields (a library config's) are ranged by the command that exposes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from draftsmith.core.config import field_docs

__all__ = [
    "ANY_NUMBER",
    "POSITIONAL",
    "Range",
    "above",
    "add_flags",
    "as_config",
    "at_least",
    "between",
    "check_ranges",
    "from_flags",
    "parser_for",
]

POSITIONAL = {"positional": True}
"""Field metadata: the field is a positional argument (optional when it has a default)."""

Config = TypeVar("Config")


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric flag takes: above `low` and below `high` (None: unbounded), each
    bound included unless open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            return (
                f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
            )
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {high}"
        return "any number"


ANY_NUMBER = Range()
"""A numeric flag that takes every value (a seed, say)."""


def at_least(low: float) -> Range:
    """``>= low``."""
    return Range(low=low)


def above(low: float) -> Range:
    """``> low``."""
    return Range(low=low, low_open=True)


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Range:
    """From `low` to `high`, both included unless open."""
    return Range(low=low, high=high, low_open=low_open, high_open=high_open)


SAMPLING_RANGES: dict[str, Range] = {
    "max_new_tokens": at_least(1),
    "temperature": at_least(0),
    "top_p": between(0, 1, low_open=True),
    "top_k": at_least(1),
    "seed": at_least(0),
}
"""The ranges of the decoding flags every command that generates shares."""


def check_ranges(cls: type, values: dict[str, Any]) -> None:
    """Raise a ValueError naming the flag, the value and the range for the first of `values`
    (field name -> value, None skipped) outside its field's range in ``cls.FLAG_RANGES``."""
    for name, allowed in getattr(cls, "FLAG_RANGES", {}).items():
        value = values.get(name)
        for one in value if isinstance(value, (list, tuple)) else [value]:
            if one is not None and one not in allowed:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be {allowed}, got {_number(one)}")


def parser_for(cls: type, prog: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A parser with one argument per field of `cls`; the class docstring is its description."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=inspect.cleandoc(cls.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )
    add_flags(parser, cls)
    return parser


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one argument per init field of dataclass `cls` to `parser`."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    aliases = getattr(cls, "FLAG_ALIASES", {})
    ranges = getattr(cls, "FLAG_RANGES", {})
    # Positionals first, then required flags, each group in field order.
    ordered = sorted(
        (f for f in dataclasses.fields(cls) if f.init),
        key=lambda f: (not f.metadata.get("positional"), _default(f) is not dataclasses.MISSING),
    )
    for f in ordered:
        kwargs = _type_kwargs(hints[f.name], f.name)
        if kwargs.get("type") in (int, float) and "choices" not in kwargs and f.name not in ranges:
            raise TypeError(
                f"field {f.name!r} is numeric: give its range in {cls.__name__}.FLAG_RANGES "
                "(at_least, above, between or ANY_NUMBER)"
            )
        default = _default(f)
        required = default is dataclasses.MISSING
        help_text = docs.get(f.name, "").replace("``", "").replace("%", "%%")
        shown = [] if required or default in (None, [], ()) else [f"default: {_show(default)}"]
        if ranges.get(f.name, ANY_NUMBER) != ANY_NUMBER:
            shown.append(f"must be {ranges[f.name]}")
        if shown:
            help_text += f" ({'; '.join(shown)})"
        if f.metadata.get("positional"):
            if not required:
                kwargs["nargs"] = "*" if kwargs.get("nargs") else "?"
                kwargs["default"] = default
            names, kwargs["metavar"] = [f.name], f.metadata.get("metavar", f.name.upper())
        else:
            names = ["--" + f.name.replace("_", "-"), *aliases.get(f.name, ())]
            kwargs.update(dest=f.name, required=required)
            if not required:
                kwargs["default"] = default
        action = parser.add_argument(*names, **kwargs)
        # Set afterwards: some Pythons' BooleanOptionalAction append their own default.
        action.help = help_text


def from_flags(cls: type[Config], args: argparse.Namespace) -> Config:
    """The dataclass `cls` from `args` parsed by a parser `add_flags(parser, cls)` built; its own
    validation (``__post_init__``) runs as for any other construction."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.init:
            value = getattr(args, f.name)
            values[f.name] = _from_list(hints[f.name], value) if isinstance(value, list) else value
    check_ranges(cls, values)
    return cls(**values)


def as_config(command: Any, cls: type[Config]) -> Config:
    """The library config `cls` inside a command that inherits it (without the command's own
    fields, so it serialises as the library expects)."""
    return cls(**{f.name: getattr(command, f.name) for f in dataclasses.fields(cls) if f.init})


def _type_kwargs(hint: Any, name: str) -> dict[str, Any]:
    """argparse's type, choices, nargs and action for a field annotated `hint`."""
    hint = _without_none(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        return {"type": type(args[0]), "choices": args}
    if origin in (tuple, list) and (origin is list or args[-1:] == (...,)):
        return {**_type_kwargs(args[0], name), "nargs": "+"}
    if hint in (int, float, str, Path):
        return {"type": hint}
    if _one_or_many(hint) is not None:  # X | list[X]: one value or several
        return {**_type_kwargs(_one_or_many(hint), name), "nargs": "+"}
    raise TypeError(f"field {name!r}: no command-line flag for type {hint!r}")


def _without_none(hint: Any) -> Any:
    """``X`` of ``X | None`` (the flag takes an X; None is only ever its default)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return hint


def _one_or_many(hint: Any) -> Any:
    """``X`` of ``X | list[X]``, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 2:
        scalar, many = args
        if typing.get_origin(many) is list and typing.get_args(many) == (scalar,):
            return scalar
    return None


def _from_list(hint: Any, values: list) -> Any:
    """argparse's list of nargs values as the field wants them: a tuple for a tuple field, the
    one value itself for an ``X | list[X]`` field given one."""
    hint = _without_none(hint)
    if _one_or_many(hint) is not None:
        return values[0] if len(values) == 1 else values
    return (typing.get_origin(hint) or list)(values)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _number(value: float | None) -> str:
    """1 for 1.0, else the value as Python writes it."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _show(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
