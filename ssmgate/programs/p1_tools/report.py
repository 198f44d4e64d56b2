"""The P1 tool-calling section of the reproduction report (Figs 4-5) and its summary entry `p1_tools`.

`build(runs, ...)` takes the summaries of `tools_pretrain` (p2_lm) and `tools_sft` (p1_tools) and
returns ({"accuracy": {s: {k}}, "hallucination": {s: {k}}, "weak": {beta: {s: {k}}},
"weak_hallucination", "weak_recall", "bm25_recall", "checks", "wall_s", ...}, markdown) with the
paper's readings at k = 72 (protocol §5.3) beside ours at the largest evaluated pool.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ssmgate.plotting import pyplot
from ssmgate.report.format import Checks, report_tail, table

RUNS = ("tools_pretrain", "tools_sft")
WEAK_SCALES, STRONG_SCALES = ("0.06", "0.12", "0.25"), ("8", "16")   # protocol §5.3's groups
PAPER_AT_72 = {"weak gate (s = 0.06-0.25)": ("0.28-0.30", "0.30-0.32"), "strong gate (s = 8, 16)": ("0.20-0.21", "0.50-0.54"),
               "Transformer": ("0.01-0.02", "0.90")}


def _curve(row: dict):
    ks = sorted(row, key=int)
    return [int(k) for k in ks], [row[k] for k in ks]


def _group_mean(table_sk: dict, scales, k: str):
    values = [table_sk[s][k] for s in scales if s in table_sk and k in table_sk[s]]
    return float(np.mean(values)) if values else None


def collect(runs: dict) -> dict:
    sft = runs.get("tools_sft")
    if sft is None:
        return {}
    keys = ("gate_scales", "accuracy", "hallucination", "malformed", "name_accuracy", "name_out_of_pool", "weak",
            "weak_hallucination", "weak_name_accuracy", "weak_recall", "bm25_recall", "n_train", "n_test", "steps")
    entry = {k: sft[k] for k in keys if k in sft}
    pre = runs.get("tools_pretrain")
    if pre is not None:
        entry["pretrain_ppl"] = pre.get("ppl")
    return entry


def checks(entry: dict) -> Checks:
    """P1 Figs 4/5 at the largest pool size (strict orderings: a tie fails)."""
    if not entry.get("accuracy"):
        return Checks()
    k = max(next(iter(entry["accuracy"].values())), key=int)
    out = Checks()
    weak, strong = (_group_mean(entry["accuracy"], g, k) for g in (WEAK_SCALES, STRONG_SCALES))
    if weak is not None and strong is not None:
        out.add(f"weak_gate_accuracy_above_strong_at_k{k}", weak > strong,
                f"P1 Fig 4: with k = {k} retrieved tools the weak gates call the right tool more often than the "
                "strong gates", "acceptance, P1 Fig 4/5: weak - strong accuracy > 0 at k = 72")
    h = entry["hallucination"]
    if "16" in h and "0.06" in h:
        out.add(f"hallucination_s16_above_s0.06_at_k{k}", h["16"][k] > h["0.06"][k],
                f"P1 Fig 5: with k = {k} the strong gate (s = 16) names tools outside the pool more often than "
                "the weak (s = 0.06)", "acceptance, P1 Fig 4/5: hallucination(s=16) > hallucination(s=0.06)")
    return out


def recheck(entry: dict) -> Checks:
    """The checks of a summary entry written earlier (its runs' folders gone)."""
    return checks(entry)


def _figure(entry: dict, path: Path, k_max_train) -> None:
    weak = entry.get("weak", {})
    main_panels = [("accuracy", "accuracy (BFCL checker)"), ("hallucination", "out-of-pool hallucination")]
    if "name_accuracy" in entry:
        main_panels += [("name_accuracy", "right function named (lenient)"),
                        ("name_out_of_pool", "name outside the pool (lenient)")]
    panels = len(main_panels) + len(weak)
    plt = pyplot()
    fig, axes = plt.subplots(1, panels, figsize=(4.3 * panels, 3.5), squeeze=False)
    cmap = plt.get_cmap("coolwarm")
    scales = entry["gate_scales"]
    colour = {s: cmap(i / max(len(scales) - 1, 1)) for i, s in enumerate(scales)}
    for ax, (metric, title) in zip(axes[0], main_panels):
        for s in scales:
            ks, v = _curve(entry[metric][s])
            ax.plot(ks, v, marker="o", ms=3, color=colour[s], label=f"s={s}")
        ax.set(xlabel="pool size k", title=f"{title}, main setting")
    for ax, (beta, table_sk) in zip(axes[0][len(main_panels):], weak.items()):
        for s in scales:
            ks, v = _curve(table_sk[s])
            ax.plot(ks, v, marker="o", ms=3, color=colour[s])
        ks, v = _curve(entry["weak_recall"][beta])
        ax.plot(ks, v, ls="--", color="grey", label="recall@k")
        ax.set(xlabel="pool size k", title=f"accuracy, weak retriever β={beta}")
        ax.legend(fontsize=7)
    for ax in axes[0]:
        if k_max_train:
            ax.axvline(k_max_train, ls=":", color="k", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build(runs: dict, scale: str, changes: dict, walls: dict, figure_dir: Path, run_root: Path):
    del run_root
    figure_dir.mkdir(parents=True, exist_ok=True)
    entry = collect(runs)
    entry["checks"] = checks(entry)
    entry["wall_s"] = walls
    lines = [f"## P1 Figures 4 and 5: tool calling with retrieved pools ({scale} scale)", ""]
    if not entry.get("accuracy"):
        return entry, "\n".join(lines + report_tail({}, [r for r in RUNS if r not in runs], changes)) + "\n"
    k = max(next(iter(entry["accuracy"].values())), key=int)
    k_train = runs["tools_sft"].get("k_max_train")
    lines += [f"Fine-tuned on tool-calling prompts of {entry['n_train']} BFCL python-simple questions; evaluated on "
              f"the {entry['n_test']} questions of held-out functions (never an answer in fine-tuning). Gate scale s "
              "applied to the pretrained model before fine-tuning (A_log += log s). Accuracy: the BFCL checker on "
              "the whole call; hallucination: a valid call to a function not in the pool; malformed: not one "
              "valid call. Read leniently (the function an output starts to call, valid or not): right name, and "
              "a name outside the pool.", "",
              table(["s", f"accuracy at k={k}", f"hallucination at k={k}", f"malformed at k={k}",
                     f"right name at k={k}", f"name outside pool at k={k}"],
                    [[s, entry["accuracy"][s][k], entry["hallucination"][s][k], entry["malformed"][s][k],
                      entry.get("name_accuracy", {}).get(s, {}).get(k), entry.get("name_out_of_pool", {}).get(s, {}).get(k)]
                     for s in entry["gate_scales"]]),
              "The paper at k = 72 (protocol §5.3, readings of Fig 4):", "",
              table(["group", "accuracy", "hallucination"], [[g, *v] for g, v in PAPER_AT_72.items()])]
    _figure(entry, figure_dir / "p1_tools.png", k_train)
    lines += ["![tool calling](figures/p1_tools.png)", "",
              "BM25 recall@k of the correct tool before injection: " + ", ".join(
                  f"k={kk}: {v:.3f}" for kk, v in sorted(entry["bm25_recall"].items(), key=lambda kv: int(kv[0]))), ""]
    lines += report_tail(entry["checks"], [r for r in RUNS if r not in runs], changes)
    return entry, "\n".join(lines) + "\n"
