"""absl flags generated from a config dataclass, so a config's fields and its flags never drift.

Each field `f` becomes `--<prefix>f` (or the name `names` gives it) with default None ("not given"),
so a preset or a base config supplies the value unless the flag is set: the dataclass is the one home
of the defaults. Types come from the annotations: int, float, bool, str (an enum where `choices` lists
its values), Optional[...] of those, tuple[int | float | str, ...] (a comma-separated list) and a bare
tuple of (lo, hi) pairs written `lo:hi,lo:hi`. A field with its own syntax (a grid, 'uniform', a range)
names a parser `parse(flag, text) -> value` in `parsers`; its flag is a string and a ValueError of the
parser is the error (prefixed with '--flag=text: ' unless it names the flag itself). A ValueError
'field=value: ...' of the config's validate() is reported as '--<flag>=value: ...'. A flag renamed keeps its
old name as an alias (`keep_old_names`), so flag files written before still run.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing

from absl import flags

from ssmgate.config_error import ConfigError

FLAGS = flags.FLAGS
_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_boolean, str: flags.DEFINE_string}
_ITEMS = {int: "integers", float: "numbers", str: "names"}
RENAMED: dict[str, str] = {}   # old flag name -> its name now, for every flag renamed


def keep_old_names(old_to_new: dict, module_name: str) -> None:
    """Each old name becomes an alias of the flag's name now: a flag file that uses it still sets the flag
    (ssmgate.main says which name to write instead)."""
    for old, new in old_to_new.items():
        flags.DEFINE_alias(old, new, module_name=module_name)
        RENAMED[old] = new


def _kind(hint) -> tuple:
    """(kind, item): kind a scalar type of _DEFINE, "list" (tuple[item, ...]) or "pairs" (a bare tuple)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    if hint in _DEFINE:
        return hint, None
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in _ITEMS:
        return "list", args[0]
    return "pairs", None


def flag_name(field: str, prefix: str = "", names: dict | None = None) -> str:
    return (names or {}).get(field, prefix + field)


def _fields(cls, skip, only) -> list:
    """cls's fields but `skip`, and only those in `only` when given."""
    return [f for f in dataclasses.fields(cls) if f.name not in skip and (only is None or f.name in only)]


def define(cls, *, prefix: str = "", skip=(), only=None, helps: dict | None = None, names: dict | None = None,
           choices: dict | None = None, parsers: dict | None = None, module_name: str | None = None) -> list[str]:
    """Defines one flag per field of `cls` but `skip` (only those in `only`, when given); returns the flag
    names. `helps`: field -> help text (the default is appended unless the text states its own); `names`: field -> flag name
    other than prefix + field; `choices`: field -> the values an enum flag allows; `parsers`: field ->
    parse(flag, text) of a field with its own syntax; `module_name`: the module the flags belong to (a
    program's flags module: `--program=NAME --help` lists them as its own), default this one."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in _fields(cls, skip, only):
        kind, _ = _kind(hints[field.name])
        default = field.default if field.default is not dataclasses.MISSING else None
        shown = "" if field.default is dataclasses.MISSING else f" (default {_shown(default)})"
        given = (helps or {}).get(field.name)
        text = f"{cls.__name__}.{field.name}{shown}." if given is None else \
            given if "(default" in given else given + shown   # a help may state a default of its own
        name = flag_name(field.name, prefix, names)
        owner = {"module_name": module_name} if module_name else {}
        if field.name in (choices or {}):
            flags.DEFINE_enum(name, None, list(choices[field.name]), text, **owner)
        elif field.name in (parsers or {}):
            flags.DEFINE_string(name, None, text, **owner)
        elif kind == "list":
            flags.DEFINE_list(name, None, text, **owner)
        elif kind == "pairs":
            flags.DEFINE_string(name, None, text + " Pairs 'lo:hi,lo:hi,...'.", **owner)
        else:
            _DEFINE[kind](name, None, text, **owner)
        out.append(name)
    return out


def _shown(default) -> str:
    """A default as a flag would be written: a list comma-separated ('' when empty), else its repr."""
    return repr(",".join(str(v) for v in default)) if isinstance(default, tuple) else repr(default)


def _parse_pairs(flag: str, text: str):
    try:
        pairs = tuple(tuple(float(v) for v in item.split(":")) for item in text.split(",") if item.strip())
    except ValueError:
        pairs = ((),)
    if any(len(p) != 2 for p in pairs):
        raise ConfigError(f"--{flag}={text}: expected pairs 'lo:hi,lo:hi,...'")
    return pairs


def _parse_list(flag: str, items: list, item_type):
    try:
        return tuple(item_type(v) for v in items)
    except ValueError:
        raise ConfigError(f"--{flag}={','.join(items)}: expected comma-separated {_ITEMS[item_type]}") from None


def _parse_own(flag: str, text: str, parse):
    try:
        return parse(flag, text)
    except ValueError as e:
        raise ConfigError(str(e) if str(e).startswith(f"--{flag}") else f"--{flag}={text}: {e}") from None


def overrides(cls, *, prefix: str = "", skip=(), only=None, names: dict | None = None,
              parsers: dict | None = None) -> dict:
    """The fields whose flags were given (value not None), parsed."""
    hints = typing.get_type_hints(cls)
    out = {}
    for field in _fields(cls, skip, only):
        name = flag_name(field.name, prefix, names)
        if FLAGS[name].value is None:
            continue
        value, (kind, item) = FLAGS[name].value, _kind(hints[field.name])
        if field.name in (parsers or {}):
            value = _parse_own(name, value, parsers[field.name])
        elif kind == "list":
            value = _parse_list(name, value, item)
        elif kind == "pairs":
            value = _parse_pairs(name, value)
        out[field.name] = value
    return out


def build(cls, base=None, *, prefix: str = "", skip=(), extra: dict | None = None, names: dict | None = None,
          parsers: dict | None = None, program: str | None = None):
    """`base` (an instance of cls; None: cls's defaults, every field without one a required flag of
    `program`) with the given flags applied, validated; a ValueError from validate() becomes a
    ConfigError that names the flag."""
    changes = dict(overrides(cls, prefix=prefix, skip=skip, names=names, parsers=parsers), **(extra or {}))
    if base is None:
        for field in dataclasses.fields(cls):
            if (field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
                    and field.name not in changes):
                raise ConfigError(f"--{flag_name(field.name, prefix, names)} is required"
                                  + (f" for --program={program}" if program else ""))
    try:
        cfg = dataclasses.replace(base, **changes) if base is not None else cls(**changes)
        return cfg.validate() if hasattr(cfg, "validate") else cfg
    except ValueError as e:
        raise ConfigError(flag_message(str(e), cls, prefix, names)) from None


def flag_message(message: str, cls, prefix: str = "", names: dict | None = None, *, unmatched: str = "name") -> str:
    """Rewrites 'Cls.field=value: ...' or 'field=value: ...' to '--<flag>=value: ...'; a message about no
    field is prefixed with the class name (`unmatched="name"`) or kept as it is ("keep"); one that names
    its flag itself ('--...') is kept."""
    if message.startswith("--"):
        return message
    for field in dataclasses.fields(cls):
        pattern = rf"^(?:{cls.__name__}\.)?{re.escape(field.name)}="
        if re.match(pattern, message):
            return re.sub(pattern, f"--{flag_name(field.name, prefix, names)}=", message, count=1)
    return f"{cls.__name__}: {message}" if unmatched == "name" else message
