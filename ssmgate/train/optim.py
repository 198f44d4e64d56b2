"""Optimisers of protocol §3.3 (AdamW), §4.6 (Muon), §6.2 (AdamW sweeps) and §7.1, with the peak
learning rate held in the optimizer state.

    make_optimizer(cfg) = chain(
        clip_by_global_norm(clip_norm),                       # only when clip_norm > 0
        inject_hyperparams(base)(learning_rate=peak),         # sgd | adamw | muon at a constant lr
        scale_by_lr_multiplier(schedule_multiplier(cfg)))     # warmup + cosine, a unitless factor

The peak lr is an array in the state (`get_learning_rate` / `set_learning_rate`), so a vmapped
sweep gives every replica its own lr with one compilation; the schedule is a pure function of
the step count and multiplies the whole update. For AdamW the update is then
    -peak * m(t) * (adam_direction + weight_decay * params),
exactly `optax.adamw(learning_rate=peak * m(t))`: the decoupled decay is scaled by the full
scheduled lr, as in optax and PyTorch (the tests hold the two against each other).

Weight decay touches the weights of linear maps (`kernel` leaves) and the embedding table only,
unless `decay_all`: norm scales, biases and the gate/phase parameters (A_log, dt_bias, D, angles,
B/C biases) are not decayed (as in the Mamba reference), so decay cannot drag a gate
initialisation — the thing P1 studies — towards A_log = 0.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, muon

from ssmgate.tree_paths import path_tuple

OPTIMIZERS = ("sgd", "adamw", "muon")


@dataclasses.dataclass(frozen=True)
class OptimCfg:
    name: str = "adamw"               # one of OPTIMIZERS
    lr: float = 3e-4                  # peak learning rate (the injected hyperparameter)
    warmup_steps: int = 0             # linear 0 -> peak over these steps
    total_steps: int = 1000           # cosine reaches final_lr_frac * peak here, flat after
    final_lr_frac: float = 0.1        # cosine floor as a fraction of peak (protocol §3.3: 0.1)
    b1: float = 0.9                   # adamw, and muon's AdamW group
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1         # decoupled for adamw/muon, L2 on the gradient for sgd
    decay_all: bool = False           # decay every param, not only kernels and the embedding
    momentum: float = 0.0             # sgd heavy-ball momentum (0 = plain SGD)
    muon_beta: float = 0.95           # muon momentum of the Newton-Schulz group
    clip_norm: float = 1.0            # clip the global gradient norm to this (0 = off)
    muon_adam_lr: Optional[float] = None  # peak lr of muon's AdamW group (None = lr)

    def validate(self) -> "OptimCfg":
        def bad(field, allowed):
            raise ValueError(f"OptimCfg.{field}={getattr(self, field)!r}: expected {allowed}")

        if self.name not in OPTIMIZERS:
            bad("name", f"one of {OPTIMIZERS}")
        if not self.lr > 0:
            bad("lr", "a value > 0")
        if self.total_steps < 1:
            bad("total_steps", "an integer >= 1")
        if not 0 <= self.warmup_steps <= self.total_steps:
            bad("warmup_steps", f"an integer in [0, total_steps = {self.total_steps}]")
        if not 0.0 <= self.final_lr_frac <= 1.0:
            bad("final_lr_frac", "a value in [0, 1]")
        for field in ("b1", "b2", "momentum", "muon_beta"):
            if not 0.0 <= getattr(self, field) < 1.0:
                bad(field, "a value in [0, 1)")
        if not self.eps > 0:
            bad("eps", "a value > 0")
        for field in ("weight_decay", "clip_norm"):
            if not getattr(self, field) >= 0:
                bad(field, "a value >= 0")
        if self.muon_adam_lr is not None and not self.muon_adam_lr > 0:
            bad("muon_adam_lr", "None (= lr) or a value > 0")
        return self


def schedule_multiplier(cfg: OptimCfg) -> optax.Schedule:
    """count -> factor: linear 0 -> 1 over warmup_steps, cosine 1 -> final_lr_frac at
    total_steps, flat after. The lr applied at update `count` is peak * factor(count)."""
    cfg.validate()
    warm, total, floor = cfg.warmup_steps, cfg.total_steps, cfg.final_lr_frac

    def multiplier(count):
        t = jnp.asarray(count, jnp.float32)
        warmup = t / max(warm, 1)
        frac = jnp.clip((t - warm) / max(total - warm, 1), 0.0, 1.0)
        cosine = floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
        return jnp.where(t < warm, warmup, cosine)

    return multiplier


class LrMultiplierState(NamedTuple):
    count: jax.Array          # updates applied so far
    lr_multiplier: jax.Array  # factor of the latest update (before the first: of the first)


def scale_by_lr_multiplier(multiplier: optax.Schedule) -> optax.GradientTransformation:
    """Like optax.scale_by_schedule, but keeps the factor it applied so that the step can report
    the effective lr without knowing the schedule."""
    def init(params):
        del params
        return LrMultiplierState(jnp.zeros([], jnp.int32), jnp.asarray(multiplier(0), jnp.float32))

    def update(updates, state, params=None):
        del params
        m = jnp.asarray(multiplier(state.count), jnp.float32)
        return optax.tree.scale(m, updates), LrMultiplierState(optax.safe_increment(state.count), m)

    return optax.GradientTransformation(init, update)


# ---------------------------------------------------------------------------- param masks

def is_hidden_matrix(key_path, leaf) -> bool:
    """Muon's domain: 2-D `kernel`s of linear maps between hidden features. The embedding table
    and the LM head map tokens, and a depthwise conv kernel (taps, channels) is no linear map
    between features, so they go to AdamW with every other param (protocol §4.6 [REC])."""
    names = path_tuple(key_path)
    return leaf.ndim == 2 and names[-1] == "kernel" and "lm_head" not in names and "conv" not in names


def is_decayed(key_path, leaf) -> bool:
    """Weight decay's default domain: kernels and the embedding table."""
    del leaf
    return path_tuple(key_path)[-1] in ("kernel", "embedding")


def muon_mask(params):
    """Tree of bools: True where Muon updates the leaf, False where AdamW does."""
    return jax.tree_util.tree_map_with_path(is_hidden_matrix, params)


def decay_mask(params):
    """Tree of bools: True where weight decay applies by default."""
    return jax.tree_util.tree_map_with_path(is_decayed, params)


def _muon_dims(params):
    return jax.tree_util.tree_map_with_path(
        lambda p, x: MuonDimensionNumbers(reduction_axis=0, output_axis=1) if is_hidden_matrix(p, x) else None,
        params)


# ---------------------------------------------------------------------------- optimizers

def _base(cfg: OptimCfg):
    """The optimizer at a constant `learning_rate`: the factory inject_hyperparams wraps. Only
    the lr is an argument, so it is the only hyperparameter that becomes state."""
    mask = None if cfg.decay_all else decay_mask
    wd = cfg.weight_decay

    def sgd(learning_rate):
        # Coupled L2 (decay added to the gradient before momentum), as torch.optim.SGD does.
        decay = [optax.add_decayed_weights(wd, mask)] if wd else []
        return optax.chain(*decay, optax.sgd(learning_rate, momentum=cfg.momentum or None))

    def adamw(learning_rate):
        return optax.adamw(learning_rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, mu_dtype=jnp.float32,
                           weight_decay=wd, mask=mask)

    adam_ratio = (cfg.muon_adam_lr or cfg.lr) / cfg.lr

    def muon_adamw(learning_rate):
        adam_lr = learning_rate * adam_ratio  # set_learning_rate moves both groups together

        def adam_decay_mask(params):
            wanted = decay_mask(params) if mask else jax.tree.map(lambda _: True, params)
            return jax.tree.map(lambda w, m: w and not m, wanted, muon_mask(params))

        # contrib.muon's AdamW group has no decay mask, so its decay is added after it instead:
        # -adam_lr * wd * params is exactly the term adamw(adam_lr, wd) adds after Adam scaling.
        adam_decay = [optax.add_decayed_weights(-adam_lr * wd, adam_decay_mask)] if wd else []
        # Muon's group holds kernels only, all decayed by default (weight_decay_mask=None).
        return optax.chain(
            muon(learning_rate, beta=cfg.muon_beta, eps=cfg.eps, weight_decay=wd, mu_dtype=jnp.float32,
                 adam_b1=cfg.b1, adam_b2=cfg.b2, adam_weight_decay=0.0, adam_learning_rate=adam_lr,
                 muon_weight_dimension_numbers=_muon_dims),
            *adam_decay)

    return {"sgd": sgd, "adamw": adamw, "muon": muon_adamw}[cfg.name]


def make_optimizer(cfg: OptimCfg) -> optax.GradientTransformation:
    cfg.validate()
    # float32 hyperparameters whatever the params' dtype, so a bf16 leaf cannot round the lr
    base = optax.inject_hyperparams(_base(cfg), hyperparam_dtype=jnp.float32)(learning_rate=cfg.lr)
    clip = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
    return optax.chain(*clip, base, scale_by_lr_multiplier(schedule_multiplier(cfg)))


# ---------------------------------------------------------------------------- lr access

def _get(opt_state, key: str):
    value = optax.tree.get(opt_state, key)
    if value is None:
        raise ValueError(f"optimizer state has no {key!r}: expected a state from ssmgate.train.optim.make_optimizer")
    return value


def get_learning_rate(opt_state) -> jax.Array:
    """The peak lr (per replica when the state is stacked)."""
    return _get(opt_state, "learning_rate")


def set_learning_rate(opt_state, lr):
    """A copy of `opt_state` with peak lr `lr`: a scalar, or one value per replica of a stacked state."""
    old = get_learning_rate(opt_state)
    lr = jnp.asarray(lr, jnp.float32)
    try:
        lr = jnp.broadcast_to(lr, old.shape)
    except ValueError:
        raise ValueError(f"learning rate of shape {lr.shape}: expected a scalar or shape {old.shape} "
                         f"(one per replica of the state)") from None
    return optax.tree.set(opt_state, learning_rate=lr)


def current_learning_rate(opt_state) -> jax.Array:
    """The lr of the latest update: peak * schedule factor (before any update: of the first)."""
    return get_learning_rate(opt_state) * _get(opt_state, "lr_multiplier")
