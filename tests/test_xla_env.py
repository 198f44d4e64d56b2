import os

from ssmgate import xla_env


def test_defaults_are_added_unless_the_user_named_the_flag():
    env = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
    xla_env.apply_defaults(env)
    assert env["XLA_FLAGS"] == ("--xla_backend_optimization_level=0"
                                " --xla_cpu_enable_concurrency_optimized_scheduler=false")
    mine = {"XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"}
    xla_env.apply_defaults(mine)
    assert mine["XLA_FLAGS"] == "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    empty = {}
    xla_env.apply_defaults(empty)
    assert empty["XLA_FLAGS"] == "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def test_importing_ssmgate_set_them_for_this_process():
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=" in os.environ["XLA_FLAGS"]


def test_defaults_can_be_turned_off():
    env = {"XLA_FLAGS": "--xla_backend_optimization_level=0", "SSMGATE_XLA_DEFAULTS": "0"}
    xla_env.apply_defaults(env)
    assert env["XLA_FLAGS"] == "--xla_backend_optimization_level=0"
