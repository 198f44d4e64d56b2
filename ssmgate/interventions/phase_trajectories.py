"""Phase trajectories of a Mamba-3 model (protocol §8.5, P2's Fig 4).

For one sequence, every (layer, head, pair) channel has per-token phase increments dt_t theta_t
(the mixer sows them as `intermediates/phase_increment`) and a cumulative phase
phi_t = sum_{s <= t} dt_s theta_s. Its "phase travel" over the span is sum_t |dt_t theta_t|.
Channels that complete at least one full turn (travel >= 2 pi) are ranked by travel and the ones
nearest chosen percentiles (10th / 50th / 99th: slow, medium, fast) are drawn as cos phi_t and
sin phi_t against the token offset from the end of the sequence. Illustrative, as in the paper.
`class_numbers` puts numbers on the figure: per class the cycles completed over the span
(travel / 2 pi) and the tokens per cycle, and the travel ratios between the classes.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from ssmgate.models.lm import LanguageModel, sown_intermediates

FULL_TURN = 2.0 * np.pi
CLASSES = {"slow": 10.0, "medium": 50.0, "fast": 99.0}  # protocol §8.5: the percentiles of travel drawn


class Channel(NamedTuple):
    layer: int
    head: int
    pair: int
    travel: float     # radians over the span
    percentile: float  # the percentile it was picked for


def phase_increments(model: LanguageModel, params, tokens) -> np.ndarray:
    """(layers, t, H, r) float64 per-token phase increments of one sequence `tokens` (t,)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"phase_increments: tokens of shape {tokens.shape}; expected one sequence (t,)")
    layers = sown_intermediates(model, params, tokens[None])
    found = [name for name in sorted(layers, key=lambda n: int(n.split("_")[-1]))
             if "phase_increment" in layers[name].get("mixer", {})]
    if not found:
        raise ValueError("phase_increments: the model sows no phase increments; expected Mamba-3 layers")
    return np.stack([np.asarray(layers[name]["mixer"]["phase_increment"][0][0], np.float64) for name in found])


def phase_travel(increments_lthr: np.ndarray) -> np.ndarray:
    """(layers, H, r): sum over the span of |increment|."""
    return np.abs(increments_lthr).sum(axis=1)


def pick_channels(travel_lhr: np.ndarray, percentiles: Sequence[float] = tuple(CLASSES.values()),
                  min_travel: float = FULL_TURN) -> list[Channel]:
    """Among the channels with travel >= min_travel, the one nearest each percentile of travel."""
    eligible = np.argwhere(travel_lhr >= min_travel)
    if len(eligible) == 0:
        raise ValueError(f"pick_channels: no channel travels {min_travel:.3g} rad or more over the span "
                         f"(largest {travel_lhr.max():.3g}); use a longer sequence or a lower min_travel")
    values = travel_lhr[tuple(eligible.T)]
    picks = []
    for q in percentiles:
        target = np.percentile(values, q)
        i = int(np.argmin(np.abs(values - target)))
        picks.append(Channel(*(int(v) for v in eligible[i]), float(values[i]), float(q)))
    return picks


def class_numbers(channels: Sequence[Channel], tokens: int) -> dict:
    """The channels picked at CLASSES' percentiles as numbers: {"classes": {slow | medium | fast: {layer,
    head, pair, percentile, travel (rad), cycles (travel / 2 pi), tokens_per_cycle}}, "travel_ratio":
    {fast_over_slow, medium_over_slow, fast_over_medium}}."""
    by_pct = {c.percentile: c for c in channels}
    missing = [name for name, q in CLASSES.items() if float(q) not in by_pct]
    if missing:
        raise ValueError(f"class_numbers: no channel picked for {', '.join(missing)} "
                         f"(percentiles {sorted(by_pct)}; expected {list(CLASSES.values())})")
    classes = {}
    for name, q in CLASSES.items():
        c = by_pct[float(q)]
        cycles = c.travel / FULL_TURN
        classes[name] = {"layer": c.layer, "head": c.head, "pair": c.pair, "percentile": c.percentile,
                         "travel": c.travel, "cycles": cycles, "tokens_per_cycle": tokens / cycles}
    t = {name: v["travel"] for name, v in classes.items()}
    return {"classes": classes, "travel_ratio": {"fast_over_slow": t["fast"] / t["slow"],
                                                 "medium_over_slow": t["medium"] / t["slow"],
                                                 "fast_over_medium": t["fast"] / t["medium"]}}


def cumulative_phase(increments_lthr: np.ndarray, channel: Channel) -> np.ndarray:
    """phi_t of one channel over the span (t,), starting from 0."""
    return np.cumsum(increments_lthr[channel.layer, :, channel.head, channel.pair])


def plot(increments_lthr: np.ndarray, channels: Sequence[Channel], path, title: str = "") -> None:
    """One column per channel: cos phi and sin phi against the offset from the sequence end."""
    from ssmgate.plotting import pyplot
    plt = pyplot()
    fig, axes = plt.subplots(1, len(channels), figsize=(4 * len(channels), 2.8), squeeze=False)
    t = increments_lthr.shape[1]
    offset = np.arange(t) - (t - 1)
    for ax, ch in zip(axes[0], channels):
        phi = cumulative_phase(increments_lthr, ch)
        ax.plot(offset, np.cos(phi), lw=0.8, label="cos φ")
        ax.plot(offset, np.sin(phi), lw=0.8, label="sin φ")
        ax.set_title(f"L{ch.layer} h{ch.head} pair {ch.pair}: p{ch.percentile:g}, {ch.travel / FULL_TURN:.1f} turns",
                     fontsize=8)
        ax.set_xlabel("token offset from the end")
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
