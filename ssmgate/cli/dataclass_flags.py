"""absl flags generated from a config dataclass, so a config's fields and its flags never drift.

Each field `f` becomes `--<prefix>f` with default None ("not given"), so a preset or a base config
supplies the value unless the flag is set. Types come from the annotations: int, float, bool, str,
Optional[...] of those, and tuples of (lo, hi) pairs written `lo:hi,lo:hi`.
"""
from __future__ import annotations

import dataclasses
import re
import typing

from absl import flags

from ssmgate.config_error import ConfigError

FLAGS = flags.FLAGS
_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_boolean, str: flags.DEFINE_string}


def _base_type(hint):
    if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    return hint if hint in _DEFINE else tuple


def define(cls, *, prefix: str = "", skip=(), helps: dict | None = None) -> list[str]:
    """Defines one flag per field of `cls` (except `skip`); returns the flag names."""
    hints = typing.get_type_hints(cls)
    names = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        kind = _base_type(hints[field.name])
        default = field.default if field.default is not dataclasses.MISSING else None
        text = (helps or {}).get(field.name, f"{cls.__name__}.{field.name} (default {default!r}).")
        name = prefix + field.name
        if kind is tuple:
            flags.DEFINE_string(name, None, text + " Pairs 'lo:hi,lo:hi,...'.")
        else:
            _DEFINE[kind](name, None, text)
        names.append(name)
    return names


def _parse_pairs(flag: str, text: str):
    try:
        pairs = tuple(tuple(float(v) for v in item.split(":")) for item in text.split(",") if item.strip())
    except ValueError:
        pairs = ((),)
    if any(len(p) != 2 for p in pairs):
        raise ConfigError(f"--{flag}={text}: expected pairs 'lo:hi,lo:hi,...'")
    return pairs


def overrides(cls, *, prefix: str = "", skip=()) -> dict:
    """The fields whose flags were given (value not None), parsed."""
    hints = typing.get_type_hints(cls)
    out = {}
    for field in dataclasses.fields(cls):
        name = prefix + field.name
        if field.name in skip or FLAGS[name].value is None:
            continue
        value = FLAGS[name].value
        out[field.name] = _parse_pairs(name, value) if _base_type(hints[field.name]) is tuple else value
    return out


def build(cls, base, *, prefix: str = "", skip=(), extra: dict | None = None):
    """`base` (an instance of cls) with the given flags applied, validated; a ValueError from
    validate() becomes a ConfigError that names the flag."""
    changes = dict(overrides(cls, prefix=prefix, skip=skip), **(extra or {}))
    try:
        cfg = dataclasses.replace(base, **changes)
        return cfg.validate() if hasattr(cfg, "validate") else cfg
    except ValueError as e:
        raise ConfigError(_name_flag(str(e), cls, prefix)) from None


def _name_flag(message: str, cls, prefix: str) -> str:
    """Rewrites 'Cls.field=value: ...' or 'field=value: ...' to '--<prefix>field=value: ...'."""
    for field in dataclasses.fields(cls):
        pattern = rf"^(?:{cls.__name__}\.)?{re.escape(field.name)}="
        if re.match(pattern, message):
            return re.sub(pattern, f"--{prefix}{field.name}=", message, count=1)
    return f"{cls.__name__}: {message}"
