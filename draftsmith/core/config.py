"""Typed configs from YAML and ``key=value`` overrides, for recipes, artifacts and commands.

    config = load_config(TrainConfig, "recipes/smollm2-135m/eagle3.yaml", ["max_steps=100"])

Every key must be a field (unknown keys are errors naming the valid ones); nested configs are
nested mappings, and an override reaches into them with a dotted key. Override values are parsed
as YAML scalars (``lr=3e-4`` is a float, ``feature_cache=null`` is None).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

__all__ = [
    "ConfigError",
    "apply_overrides",
    "config_from_dict",
    "config_help",
    "config_to_dict",
    "field_docs",
    "load_config",
    "save_config",
]

Config = TypeVar("Config")


class ConfigError(ValueError):
    """A recipe or override does not fit the config's fields."""


def load_config(cls: type[Config], path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML recipe, apply ``key=value`` overrides, and build the typed config `cls`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"recipe {path} is not valid YAML: {error}") from error
    if not isinstance(raw, dict):
        raise ConfigError(f"recipe {path} must be a YAML mapping of config keys")
    return config_from_dict(cls, apply_overrides(raw, overrides))


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of `raw` with each ``dotted.key=value`` set (value parsed as a YAML scalar)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key=value (e.g. max_steps=100)")
        *parents, leaf = key.split(".")
        node = raw
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if child is None:  # e.g. eval_data: null in the recipe
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError(f"override {item!r}: {where} is not a mapping")
            node = child
        node[leaf] = yaml.safe_load(text) if text else ""
    return raw


def config_from_dict(cls: type, raw: Mapping[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from a mapping, recursively, checking keys and value types."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where or cls.__name__} must be a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(_join(where, k)) for k in unknown)} in {cls.__name__}; "
            f"valid keys: {', '.join(fields)}"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in raw
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(
            f"missing required key{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(_join(where, k)) for k in missing)} in {cls.__name__}"
        )
    hints = typing.get_type_hints(cls)
    values = {name: _convert(hints[name], value, _join(where, name)) for name, value in raw.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where or cls.__name__}: {error}") from error


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain YAML/JSON-able dict of a config (tuples become lists)."""
    return _plain(dataclasses.asdict(config))


def save_config(config: Any, path: str | Path) -> None:
    """Write `config` as YAML (it loads back with `load_config`)."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))


def config_help(cls: type, where: str = "") -> str:
    """One line per (dotted) key of `cls`: its type, default and docstring (the CLI's help)."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines = []
    for f in dataclasses.fields(cls):
        key, hint = _join(where, f.name), hints[f.name]
        nested = [hint] if dataclasses.is_dataclass(hint) else []  # optional ones stay folded
        if f.default is not dataclasses.MISSING:
            default = f" = {f.default!r}"
        elif f.default_factory is not dataclasses.MISSING and not nested:
            default = f" = {f.default_factory()!r}"
        else:
            default = " (required)" if f.default_factory is dataclasses.MISSING else ""
        lines.append(f"  {key}{default}: {docs.get(f.name, '')}")
        if nested:
            lines.append(config_help(nested[0], key))
    return "\n".join(lines)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (and of its dataclass bases), on one line."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        ):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _convert(hint: Any, value: Any, where: str) -> Any:
    """`value` checked (and converted, for nested dataclasses and tuples) against `hint`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(" / ".join(errors))
    if dataclasses.is_dataclass(hint):
        return config_from_dict(hint, value, where)
    if origin is Literal:
        if isinstance(value, bool) and not any(isinstance(a, bool) for a in args):
            # YAML 1.1 reads a bare no / off / yes / on as a bool: take the option it spelled.
            spellings = ("yes", "on", "true") if value else ("no", "off", "false")
            value = next((a for a in args if a in spellings), value)
        if value not in args:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, args))}; got {value!r}")
        return value
    if origin is dict:
        return dict(_expect(value, dict, where))
    if origin in (tuple, list):
        items = _expect(value, (list, tuple), where)
        item_hints = args[:1] * len(items) if origin is list or args[-1:] == (...,) else args
        if len(item_hints) != len(items):
            raise ConfigError(f"{where} must have {len(item_hints)} items, got {value!r}")
        converted = [
            _convert(h, v, f"{where}[{i}]")
            for i, (h, v) in enumerate(zip(item_hints, items, strict=True))
        ]
        return origin(converted)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)  # YAML 1.1 reads 3e-4 (no dot) as a string
    if hint in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{where} must be {hint.__name__}, got {value!r}")
    return _expect(value, hint, where)


def _expect(value: Any, types_: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, types_):
        names = " or ".join(
            t.__name__ for t in (types_ if isinstance(types_, tuple) else (types_,))
        )
        raise ConfigError(f"{where} must be {names}, got {value!r}")
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
