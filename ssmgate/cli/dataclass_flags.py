"""absl flags generated from a config dataclass, so a config's fields and its flags never drift.

Each field `f` becomes `--<prefix>f` (or the name `names` gives it) with default None ("not given"),
so a preset or a base config supplies the value unless the flag is set: the dataclass is the one home
of the defaults. Types come from the annotations: int, float, bool, str (an enum where `choices` lists
its values), Optional[...] of those, and tuples of (lo, hi) pairs written `lo:hi,lo:hi`. A ValueError
'field=value: ...' of the config's validate() is reported as '--<flag>=value: ...'.
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


def flag_name(field: str, prefix: str = "", names: dict | None = None) -> str:
    return (names or {}).get(field, prefix + field)


def define(cls, *, prefix: str = "", skip=(), helps: dict | None = None, names: dict | None = None,
           choices: dict | None = None, module_name: str | None = None) -> list[str]:
    """Defines one flag per field of `cls` (except `skip`); returns the flag names. `helps`: field ->
    help text (its default is appended); `names`: field -> flag name other than prefix + field;
    `choices`: field -> the values an enum flag allows; `module_name`: the module the flags belong to
    (a program's flags module: `--program=NAME --help` lists them as its own), default this one."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        kind = _base_type(hints[field.name])
        default = field.default if field.default is not dataclasses.MISSING else None
        text = ((helps or {})[field.name] + f" (default {default!r})" if field.name in (helps or {})
                else f"{cls.__name__}.{field.name} (default {default!r}).")
        name = flag_name(field.name, prefix, names)
        owner = {"module_name": module_name} if module_name else {}
        if field.name in (choices or {}):
            flags.DEFINE_enum(name, None, list(choices[field.name]), text, **owner)
        elif kind is tuple:
            flags.DEFINE_string(name, None, text + " Pairs 'lo:hi,lo:hi,...'.", **owner)
        else:
            _DEFINE[kind](name, None, text, **owner)
        out.append(name)
    return out


def _parse_pairs(flag: str, text: str):
    try:
        pairs = tuple(tuple(float(v) for v in item.split(":")) for item in text.split(",") if item.strip())
    except ValueError:
        pairs = ((),)
    if any(len(p) != 2 for p in pairs):
        raise ConfigError(f"--{flag}={text}: expected pairs 'lo:hi,lo:hi,...'")
    return pairs


def overrides(cls, *, prefix: str = "", skip=(), names: dict | None = None) -> dict:
    """The fields whose flags were given (value not None), parsed."""
    hints = typing.get_type_hints(cls)
    out = {}
    for field in dataclasses.fields(cls):
        name = flag_name(field.name, prefix, names)
        if field.name in skip or FLAGS[name].value is None:
            continue
        value = FLAGS[name].value
        out[field.name] = _parse_pairs(name, value) if _base_type(hints[field.name]) is tuple else value
    return out


def build(cls, base, *, prefix: str = "", skip=(), extra: dict | None = None, names: dict | None = None):
    """`base` (an instance of cls) with the given flags applied, validated; a ValueError from
    validate() becomes a ConfigError that names the flag."""
    changes = dict(overrides(cls, prefix=prefix, skip=skip, names=names), **(extra or {}))
    try:
        cfg = dataclasses.replace(base, **changes)
        return cfg.validate() if hasattr(cfg, "validate") else cfg
    except ValueError as e:
        raise ConfigError(flag_message(str(e), cls, prefix, names)) from None


def flag_message(message: str, cls, prefix: str = "", names: dict | None = None, *, unmatched: str = "name") -> str:
    """Rewrites 'Cls.field=value: ...' or 'field=value: ...' to '--<flag>=value: ...'; a message about no
    field is prefixed with the class name (`unmatched="name"`) or kept as it is ("keep")."""
    for field in dataclasses.fields(cls):
        pattern = rf"^(?:{cls.__name__}\.)?{re.escape(field.name)}="
        if re.match(pattern, message):
            return re.sub(pattern, f"--{flag_name(field.name, prefix, names)}=", message, count=1)
    return f"{cls.__name__}: {message}" if unmatched == "name" else message
