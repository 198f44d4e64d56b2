"""Recurrent cores as pure functions (no Flax, no globals, no I/O); see docs/extending.md, "The core contract"."""
from ssmgate.cores.damped import DampedState, damped, damped_step
from ssmgate.cores.mimo import MimoState, rotation_mimo, rotation_mimo_step
from ssmgate.cores.rotation import RotationState, rotate_pairs, rotation, rotation_step
from ssmgate.cores.scalar_decay import scalar_decay, scalar_decay_state, scalar_decay_step

__all__ = [
    "scalar_decay", "scalar_decay_step", "scalar_decay_state",
    "rotation", "rotation_step", "RotationState", "rotate_pairs",
    "damped", "damped_step", "DampedState",
    "rotation_mimo", "rotation_mimo_step", "MimoState",
]
