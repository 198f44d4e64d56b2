"""The JAX platform of a process that did not choose one: CPU where libtpu is installed but no
accelerator is attached (`import ssmgate` applies it, before JAX starts).

The test environment installs libtpu so that kernels and steps compile for TPU topologies on a
CPU-only machine (`jax.experimental.topologies`). With libtpu installed, JAX's backend start-up
loads it and tries to bring up a TPU client even when there is no TPU: libtpu then prints several
lines about undetermined accelerator types and worker hostnames, and the process falls back to
the CPU. With JAX_PLATFORMS=cpu JAX starts only the CPU client; compiling for a named TPU topology
still works, because that loads libtpu on its own.

A user's JAX_PLATFORMS (even empty) always wins, and a machine with a TPU chip or a GPU on it is
left to JAX's own choice.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import pathlib

VARIABLE = "JAX_PLATFORMS"
GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of TPU chips (v3 to TPU7x); Google's other PCI devices, e.g. the gVNIC network
# card of a GCE VM, share the vendor id.
TPU_PCI_DEVICES = {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"}
GPU_DEVICE_FILES = ("nvidia0", "nvidiactl", "kfd", "dxg")


def has_tpu_chip(pci_root: str = "/sys/bus/pci/devices") -> bool:
    for vendor in glob.glob(os.path.join(pci_root, "*", "vendor")):
        if pathlib.Path(vendor).read_text().strip() == GOOGLE_PCI_VENDOR:
            device = pathlib.Path(vendor).with_name("device")
            if device.exists() and device.read_text().strip() in TPU_PCI_DEVICES:
                return True
    return False


def has_gpu(dev_root: str = "/dev") -> bool:
    return any(os.path.exists(os.path.join(dev_root, name)) for name in GPU_DEVICE_FILES)


def libtpu_installed(environ=os.environ) -> bool:
    return bool(environ.get("TPU_LIBRARY_PATH")) or importlib.util.find_spec("libtpu") is not None


def default_platform(environ=os.environ, pci_root: str = "/sys/bus/pci/devices", dev_root: str = "/dev"):
    """'cpu' when this process should be kept on the CPU platform, else None (leave JAX to choose)."""
    if VARIABLE in environ or not libtpu_installed(environ):
        return None
    if has_tpu_chip(pci_root) or has_gpu(dev_root):
        return None
    return "cpu"


def apply_default(environ=os.environ) -> None:
    """Sets JAX_PLATFORMS=cpu where `default_platform` says so. JAX reads the variable when it is
    imported: a JAX imported before ssmgate keeps its choice (child processes get this one)."""
    platform = default_platform(environ)
    if platform:
        environ[VARIABLE] = platform
