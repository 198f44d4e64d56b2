"""The CPU platform by default where libtpu is installed and no accelerator is attached."""
import os
import subprocess
import sys

import pytest

from ssmgate import platform_env
from ssmgate.train import topology


def _pci(tmp_path, *devices):
    for i, (vendor, device) in enumerate(devices):
        d = tmp_path / "pci" / f"0000:00:0{i}.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(device + "\n")
    return str(tmp_path / "pci")


def test_cpu_only_where_libtpu_is_installed_and_nothing_is_attached(tmp_path):
    libtpu = {"TPU_LIBRARY_PATH": "/opt/libtpu.so"}
    gvnic = _pci(tmp_path, ("0x1ae0", "0x0042"))    # Google's network card, not a TPU
    (tmp_path / "dev").mkdir()
    dev = str(tmp_path / "dev")
    assert platform_env.default_platform(libtpu, gvnic, dev) == "cpu"
    # the user's choice, even an empty one, wins
    assert platform_env.default_platform({**libtpu, "JAX_PLATFORMS": "tpu"}, gvnic, dev) is None
    assert platform_env.default_platform({**libtpu, "JAX_PLATFORMS": ""}, gvnic, dev) is None
    # a TPU VM (v5e chip) or a GPU machine: JAX chooses
    tpu_vm = _pci(tmp_path / "v5e", ("0x1ae0", "0x0042"), ("0x1ae0", "0x0063"))
    assert platform_env.default_platform(libtpu, tpu_vm, dev) is None
    (tmp_path / "dev" / "nvidiactl").write_text("")
    assert platform_env.default_platform(libtpu, gvnic, dev) is None


def test_without_libtpu_nothing_is_set(monkeypatch, tmp_path):
    monkeypatch.setattr(platform_env.importlib.util, "find_spec", lambda name: None)
    assert platform_env.default_platform({}, str(tmp_path), str(tmp_path)) is None


def fresh_processes(codes: dict, drop: frozenset = frozenset()) -> dict:
    """{name: the finished `python -c code`} with this environment less the variables `drop` and
    the nominal host description (which an earlier `topology.devices` in this worker may have set:
    with it libtpu's start-up is quiet in the controls too); skips where an accelerator is attached
    (libtpu's start-up is then real, not the noise checked here)."""
    if platform_env.has_tpu_chip() or platform_env.has_gpu():
        pytest.skip("an accelerator is attached")
    # (libtpu's lock file would refuse a control's start-up beside a test worker compiling for TPU)
    drop = drop | set(topology.NOMINAL_HOST)
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    return {name: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                                 check=True) for name, code in codes.items()}


@pytest.mark.skipif(not platform_env.libtpu_installed(), reason="libtpu is not installed")
def test_a_fresh_process_starts_on_cpu_without_libtpus_start_up(monkeypatch):
    """With libtpu installed (the test environment) and JAX_PLATFORMS unset, `import ssmgate` keeps
    JAX off libtpu's TPU start-up: CPU devices and none of libtpu's lines on stderr. Without ssmgate
    JAX does start it here (the control), so the check can tell the two apart."""
    for name, value in topology.NOMINAL_HOST.items():    # as after a compile for TPU in this worker
        monkeypatch.setenv(name, value)
    code = "{}import jax; print(jax.default_backend())"
    runs = fresh_processes({name: code.format(prefix) for name, prefix in (("ssmgate", "import ssmgate; "),
                                                                           ("control", ""))}, drop={"JAX_PLATFORMS"})
    assert runs["ssmgate"].stdout.split()[-1] == "cpu"
    assert "TPU" not in runs["ssmgate"].stderr, runs["ssmgate"].stderr
    assert "TPU" in runs["control"].stderr, "libtpu's start-up printed nothing: the check cannot fail"


COMPILE_ON = """
import hashlib, jax, jax.numpy as jnp
from jax.sharding import SingleDeviceSharding
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(), in_shardings=SingleDeviceSharding(devices[0]))
print(hashlib.sha1(f.lower(jax.ShapeDtypeStruct((256, 256), jnp.float32)).compile().as_text().encode()).hexdigest())
"""


@pytest.mark.skipif(not platform_env.libtpu_installed(), reason="libtpu is not installed")
def test_compiling_for_a_topology_is_quiet_and_compiles_the_same_program():
    """ssmgate.train.topology.devices loads libtpu without its start-up lines about an undetermined
    accelerator type and worker hostnames, and the program it compiles is the one a plain
    get_topology_desc (the control, whose start-up prints those lines) compiles."""
    setups = {"ssmgate": "from ssmgate.train import topology; devices = topology.devices('v5e:2x2')",
              "control": "from jax.experimental import topologies; "
                         "devices = topologies.get_topology_desc(platform='tpu', topology_name='v5e:2x2').devices"}
    runs = fresh_processes({name: setup + COMPILE_ON for name, setup in setups.items()})
    assert "TPU_ACCELERATOR_TYPE" in runs["control"].stderr, "libtpu's start-up printed nothing: the check cannot fail"
    for line in ("TPU_ACCELERATOR_TYPE", "worker hostname"):
        assert line not in runs["ssmgate"].stderr, runs["ssmgate"].stderr
    assert runs["ssmgate"].stdout.split()[-1] == runs["control"].stdout.split()[-1]
