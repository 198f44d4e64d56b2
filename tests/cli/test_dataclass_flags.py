"""Flags generated from a config dataclass: one per field, the dataclass's defaults, parsed by type or by
a field's own parser, and errors that name the flag."""
from __future__ import annotations

import dataclasses
from typing import Optional

import pytest
from absl import flags
from absl.testing import flagsaver

from ssmgate.cli import dataclass_flags
from ssmgate.cli.grids import parse_grid
from ssmgate.config_error import ConfigError

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Demo:
    name: str
    count: int = 2
    sizes: tuple[int, ...] = (1, 2)
    scales: tuple[float, ...] = ()
    grid: tuple[float, ...] = ()
    ranges: Optional[tuple] = None
    fast: bool = False

    def validate(self) -> "Demo":
        if self.count < 1:
            raise ValueError(f"count={self.count}: expected >= 1")
        return self


NAMES, PARSERS = {"count": "dctest_n"}, {"grid": parse_grid}
DEFINED = dataclass_flags.define(Demo, prefix="dctest_", names=NAMES, parsers=PARSERS,
                                 helps={"count": "How many."})


def build(**given):
    with flagsaver.flagsaver():
        for name, text in given.items():
            FLAGS[name].parse(text)
        return dataclass_flags.build(Demo, prefix="dctest_", names=NAMES, parsers=PARSERS, program="demo")


def test_one_flag_per_field_named_by_prefix_or_map_with_the_default_in_its_help():
    assert DEFINED == ["dctest_name", "dctest_n", "dctest_sizes", "dctest_scales", "dctest_grid", "dctest_ranges",
                       "dctest_fast"]
    assert all(FLAGS[n].default is None for n in DEFINED)
    assert FLAGS["dctest_n"].help == "How many. (default 2)"
    assert "(default '1,2')" in FLAGS["dctest_sizes"].help


def test_flags_not_given_keep_the_dataclass_defaults():
    assert build(dctest_name="x") == Demo(name="x")


def test_each_kind_parsed():
    cfg = build(dctest_name="x", dctest_n="5", dctest_sizes="3,4", dctest_scales="0.5", dctest_grid="logspace:0:1:2",
                dctest_ranges="1:2,3:4", dctest_fast="true")
    assert cfg == Demo("x", 5, (3, 4), (0.5,), (1.0, 10.0), ((1.0, 2.0), (3.0, 4.0)), True)
    assert build(dctest_name="x", dctest_sizes="").sizes == ()  # given empty: none, not the default


@pytest.mark.parametrize("given, message", [
    ({}, "--dctest_name is required for --program=demo"),
    ({"dctest_name": "x", "dctest_n": "0"}, "--dctest_n=0: expected >= 1"),
    ({"dctest_name": "x", "dctest_sizes": "1,y"}, "--dctest_sizes=1,y: expected comma-separated integers"),
    ({"dctest_name": "x", "dctest_grid": "1,z"}, "--dctest_grid: cannot read 'z'"),
    ({"dctest_name": "x", "dctest_ranges": "1:2,3"}, "--dctest_ranges=1:2,3: expected pairs"),
])
def test_errors_name_the_flag(given, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        build(**given)


def test_a_parser_error_without_the_flag_is_prefixed_with_it():
    def parse(flag, text):
        raise ValueError("expected something else")
    with flagsaver.flagsaver():
        FLAGS["dctest_grid"].parse("7")
        with pytest.raises(ConfigError, match=r"^--dctest_grid=7: expected something else$"):
            dataclass_flags.overrides(Demo, prefix="dctest_", names=NAMES, parsers={"grid": parse})


def test_a_validate_message_that_names_its_flag_is_kept():
    assert dataclass_flags.flag_message("--other=1: no", Demo, "dctest_", NAMES) == "--other=1: no"
    assert dataclass_flags.flag_message("Demo.count=0: no", Demo, "dctest_", NAMES) == "--dctest_n=0: no"
    assert dataclass_flags.flag_message("odd", Demo) == "Demo: odd"


def test_only_names_the_fields_read():
    with flagsaver.flagsaver():
        FLAGS["dctest_n"].parse("7")
        FLAGS["dctest_sizes"].parse("9")
        assert dataclass_flags.overrides(Demo, prefix="dctest_", names=NAMES, only=("count",)) == {"count": 7}
