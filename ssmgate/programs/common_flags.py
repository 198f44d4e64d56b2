"""Flags shared by several programs (absl flags are global: one definition each)."""
from absl import flags

flags.DEFINE_float("lr", None, "Learning rate (SGD) or peak learning rate (schedules).")
flags.DEFINE_integer("batch", None, "Examples (sequences) per training step.")
flags.DEFINE_integer("steps", None, "Training steps (a cap where runs stop early).")
flags.DEFINE_integer("seeds", 1, "Seeds per grid point (seed, seed + 1, ...).")
flags.DEFINE_integer("seed", 0, "First seed.")
