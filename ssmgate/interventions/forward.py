"""Forward-time interventions on a Mamba-3 language model (protocol §8.1-8.4).

    model = intervened_model(cfg, Intervention("phase_removal", layers=(4, 8)))
    logits, _ = model.apply({"params": params}, tokens)     # the same params as the native model

Kinds (protocol §8.2, 8.4): phase_removal (theta = 0), phase_reversal (theta -> -theta), phase_shuffle
(per layer, head and token a random permutation of the increments across the rotated pairs, fixed
by `seed`), decay_permutation (head h decays with A of head (h + 1) mod H, keeping its dt),
remove_B / remove_C / remove_both (write / read / both with unrotated B~, C~; with `last_k` only on
the last k positions of the call, the phase still evolving). `layers` restricts any kind to a
window [start, stop) of layers (Fig 2's heat map); None = every layer. The CHECKS kinds run the
permutation code paths with identity permutations: their logits equal the native ones exactly.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ssmgate.models.config import ModelCfg
from ssmgate.models.hooks import PhaseHooks
from ssmgate.models.lm import LanguageModel

KINDS = {
    "native": {},
    "phase_removal": {"phase": "zero"},
    "phase_reversal": {"phase": "reverse"},
    "phase_shuffle": {"phase": "shuffle"},
    "decay_permutation": {"decay": "cyclic"},
    "remove_B": {"unrotate_B": True},
    "remove_C": {"unrotate_C": True},
    "remove_both": {"unrotate_B": True, "unrotate_C": True},
}
CHECKS = {
    "phase_shuffle_identity": {"phase": "shuffle_identity"},
    "decay_permutation_identity": {"decay": "identity"},
}
_ROTATION_REMOVALS = ("remove_B", "remove_C", "remove_both")


@dataclasses.dataclass(frozen=True)
class Intervention:
    kind: str = "native"
    layers: Optional[tuple] = None     # (start, stop): a window of layers; None = all
    last_k: Optional[int] = None       # remove_*: only the last k positions; None = all
    seed: int = 0                      # phase_shuffle's permutations

    def hooks(self, n_layers: int) -> Optional[tuple]:
        """One PhaseHooks (or None) per layer; None for the native model."""
        edits = {**KINDS, **CHECKS}.get(self.kind)
        if edits is None:
            raise ValueError(f"Intervention: kind={self.kind!r}; expected one of {sorted(KINDS)} "
                             f"(or the checks {sorted(CHECKS)})")
        if self.last_k is not None and self.kind not in _ROTATION_REMOVALS:
            raise ValueError(f"Intervention: last_k={self.last_k} with kind={self.kind!r}; last_k restricts "
                             f"{', '.join(_ROTATION_REMOVALS)} only")
        start, stop = (0, n_layers) if self.layers is None else tuple(self.layers)
        if not 0 <= start < stop <= n_layers:
            raise ValueError(f"Intervention: layers={self.layers}; expected a window (start, stop) with "
                             f"0 <= start < stop <= {n_layers} (the model's layers)")
        if not edits:
            return None
        return tuple(PhaseHooks(**edits, last_k=self.last_k, seed=self.seed, layer=i) if start <= i < stop else None
                     for i in range(n_layers))


def intervened_model(cfg: ModelCfg, intervention: Intervention) -> LanguageModel:
    """The language model of `cfg` with the intervention built into its forward pass; it takes the
    native model's parameters unchanged."""
    cfg = cfg.validate()
    if cfg.block != "mamba3" and intervention.kind != "native":
        raise ValueError(f"intervened_model: {intervention.kind} on block {cfg.block!r}; the interventions act on "
                         "Mamba-3 layers ('mamba3')")
    return LanguageModel(cfg, hooks=intervention.hooks(cfg.n_layers))
