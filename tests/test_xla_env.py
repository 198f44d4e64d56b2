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


def test_cpu_devices_split_a_fresh_process():
    import subprocess
    import sys
    code = "from ssmgate import xla_env; xla_env.set_cpu_devices(2); import jax; print(len(jax.devices('cpu')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "2"


def test_cpu_devices_that_disagree_or_come_too_late_are_errors():
    import jax
    import pytest
    have = len(jax.devices("cpu"))  # this process's backend has started
    xla_env.set_cpu_devices(have, {})  # asks for what it has: nothing to do
    with pytest.raises(RuntimeError, match=f"--cpu_devices={have + 1}: the JAX backend of this process has "
                                           f"already started with {have} CPU device"):
        xla_env.set_cpu_devices(have + 1, {})
    with pytest.raises(ValueError, match="XLA_FLAGS already sets --xla_force_host_platform_device_count=4"):
        xla_env.set_cpu_devices(2, {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    with pytest.raises(ValueError, match="--cpu_devices=0: expected an integer >= 1"):
        xla_env.set_cpu_devices(0, {})
