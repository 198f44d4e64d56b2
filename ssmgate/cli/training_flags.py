"""The flags several programs read, in named groups, each defined once (absl flags are global).

A program's flags are the ones its own `flags` module defines plus the groups it lists in
`GROUPS_READ` (ssmgate.programs.registry): `python -m ssmgate.main --program=NAME --help` lists
exactly those, and a flag the chosen program does not read is an error.

- run: `--seed`, `--steps`, `--batch`; seeds: `--seeds`.
- lr: `--lr`, the learning rate: one value, or a grid (`3e-3,1e-2`, `logspace:-4:-2:8`) for the
  programs that sweep it (train, p2_state_tracking); the one home of the learning rate.
- gate_offset: `--gate_offset`, the gate offset delta (Mamba-2: A_log += delta at initialisation;
  P1's gate scale s is e^delta, written `ln:s`): one value or a grid, one replica each; the one
  home of the gate offset.
- model: `--preset` and one flag per ModelCfg field; optim: `--opt_*` (OptimCfg) and
  `--schedule_steps`; mesh: `--mesh_*`; loop: the loop's cadence, checkpoints and writers.
- stop: `--escape_thr`, `--stop_thr` (a sweep's escape and early-stop thresholds).
- eval_sets: `--eval_n`, `--lengen_eval_n`; seq_len, tokenizer and task: the flag of that name.

Each flag is generated from its dataclass field (Grid, LoopCfg, RunSpec, ModelCfg, OptimCfg, MeshCfg,
StopRule; ssmgate.cli.dataclass_flags) but five declared here: `--batch`, `--task`, `--seq_len` and
`--tokenizer`, each a field of several programs' task configs, and `--lr`, whose grid spans two fields.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math

from absl import flags

from ssmgate.cli import dataclass_flags
from ssmgate.cli.grids import parse_grid
from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.train import loop, mesh as meshlib, optim, sweep
from ssmgate.train.run_spec import Grid, RunSpec

GROUPS: dict[str, list[str]] = {}


def _in(group: str, define, name: str, *args, **kwargs) -> None:
    define(name, *args, **kwargs)
    GROUPS.setdefault(group, []).append(name)


def _offsets(flag: str, text: str) -> tuple[float, ...]:
    """Gate offsets in order; an item 'ln:s' is ln s (P1's gate scale s). Whether they are distinct,
    finite and allowed for the model is RunSpec.validate's check (sweep_results.check_offsets)."""
    items = []
    for item in (s.strip() for s in text.split(",")):
        if item.startswith("ln:"):
            try:
                scale = float(item[3:])
                if not scale > 0 or not math.isfinite(scale):
                    raise ValueError
            except ValueError:
                raise ValueError(f"--{flag}: cannot read {item!r}; expected ln:S with a scale S > 0") from None
            items.append(repr(math.log(scale)))
        else:
            items.append(item)
    return parse_grid(flag, ",".join(items))


def _step_range(flag: str, text: str) -> tuple[int, int] | None:
    text = text.strip()
    if not text:
        return None
    try:
        first, last = (int(p) for p in text.split(":"))
    except ValueError:
        raise ValueError(f"--{flag}={text}: expected FIRST:LAST, two step numbers such as 10:20") from None
    return first, last


# The replica grid's flags are Grid's fields but the learning rates (--lr below: one value or a grid).
GRID_NAMES = {"offsets": "gate_offset"}
GRID_PARSERS = {"offsets": _offsets}
GROUPS["run"] = dataclass_flags.define(Grid, only=("seed",), helps={"seed": "First seed."})
GROUPS["seeds"] = dataclass_flags.define(Grid, only=("seeds",), helps={
    "seeds": "Seeds per grid point (seed, seed + 1, ...)."})
GROUPS["gate_offset"] = dataclass_flags.define(Grid, only=("offsets",), names=GRID_NAMES,
                                               parsers=GRID_PARSERS, helps={"offsets": (
    "Gate offset delta (Mamba-2: A_log += delta at initialisation): one value or a grid ('-6,-2,0,2'), one "
    "replica each; an item 'ln:s' is the offset of P1's gate scale s (delta = ln s).")})
GROUPS["run"] += dataclass_flags.define(loop.LoopCfg, only=("steps",), helps={
    "steps": "Training steps (a cap where runs stop early)."})
# --batch is a field of every task's config (KVCfg, HornCfg, ToolsCfg, ...): one flag, declared here.
_in("run", flags.DEFINE_integer, "batch", None, "Examples (sequences) per training step.")
# --lr is optim.lr, and in a learning-rate sweep Grid.more_lrs after it, in one flag with a grid syntax.
_in("lr", flags.DEFINE_string, "lr", None, "Learning rate (SGD) or peak learning rate (schedules): one value, or "
    "a grid for the programs that sweep it ('1e-3,3e-3', 'logspace:-4:-2:8').")
GROUPS["model"] = dataclass_flags.define(RunSpec, only=("preset",), helps={"preset": (
    "A named model of ssmgate.models.presets; model flags override its fields; empty: none (how a scale's flag file "
    "drops the preset of the paper file it includes).")})
GROUPS["model"] += dataclass_flags.define(ModelCfg)
GROUPS["optim"] = dataclass_flags.define(optim.OptimCfg, prefix="opt_", skip=("lr", "total_steps"))
GROUPS["optim"] += dataclass_flags.define(optim.OptimCfg, only=("total_steps",),
                                          names={"total_steps": "schedule_steps"}, helps={"total_steps": (
    "Steps of the learning-rate schedule (warmup, then cosine to its floor, flat after) (default 0 or unset: "
    "--steps). Rerunning a run with more --steps sets it to the steps the run trained with, so the extension "
    "keeps that schedule (docs/training.md).")})
GROUPS["mesh"] = dataclass_flags.define(meshlib.MeshCfg, prefix="mesh_")
_in("task", flags.DEFINE_string, "task", None, "The program's task (train: copy | recall; p2_state_tracking: "
    "parity | mod3 | arith).")
# The loop, stop and evaluation-size flags are fields of LoopCfg, StopRule and RunSpec, with their defaults.
LOOP_SKIP = ("steps", "name")
LOOP_PARSERS = {"profile_steps": _step_range}
GROUPS["loop"] = dataclass_flags.define(loop.LoopCfg, skip=LOOP_SKIP, parsers=LOOP_PARSERS, helps={
    "log_every": "Steps between progress lines and metrics.jsonl records.",
    "eval_every": "Steps between evaluations (0: only at the end).",
    "ckpt_every": "Steps between checkpoints (0: only at the end).",
    "keep_ckpts": "Checkpoints kept.",
    "tensorboard": "Write TensorBoard event files when tensorboardX is installed.",
    "ckpt_async": "Save checkpoints in the background (training goes on while they are written; a kill loses at "
                  "most the one being written).",
    "wandb_project": "Also log metrics to this Weights & Biases project (needs `pip install wandb`).",
    "profile_steps": "FIRST:LAST: write a jax.profiler trace of these steps (1-based) into RUN_DIR/profile (open it "
                     "with TensorBoard's profile plugin or Perfetto).",
})
STOP_SKIP = ("metric",)
GROUPS["stop"] = dataclass_flags.define(sweep.StopRule, skip=STOP_SKIP, helps={
    "escape_thr": "Sweep: a replica escapes at the first evaluation with the stop metric above this (the "
                  "program's default, None: no escape).",
    "stop_thr": "Sweep: a replica stops (is frozen) once the stop metric reaches this (the program's default, "
                "None: no early stop).",
})
EVAL_FIELDS = ("eval_n", "lengen_eval_n")
GROUPS["eval_sets"] = dataclass_flags.define(RunSpec, only=EVAL_FIELDS, helps={
    "eval_n": "Examples of the fixed evaluation set (own seed).",
    "lengen_eval_n": "Examples per length-generalisation set (None: --eval_n).",
})
_in("seq_len", flags.DEFINE_integer, "seq_len", 64, "Model input length (tokens per sequence).")
_in("tokenizer", flags.DEFINE_string, "tokenizer", "byte", "'byte', or a HF tokenizer.json / SentencePiece .model "
    "file.")

FLAGS = flags.FLAGS


def require(name: str, program: str):
    if FLAGS[name].value is None:
        raise ConfigError(f"--{name} is required for --program={program}")
    return FLAGS[name].value


def preset() -> str | None:
    """--preset, None when not given or empty."""
    return FLAGS.preset or None


def model_cfg(base: ModelCfg | None = None) -> ModelCfg:
    """`base` (or the `--preset`, or ModelCfg's defaults) with the model flags applied."""
    if base is None:
        base = ModelCfg()
        if preset() is not None:
            if preset() not in presets.PRESETS:
                raise ConfigError(f"--preset={FLAGS.preset}: expected one of {', '.join(sorted(presets.PRESETS))}")
            base = presets.PRESETS[preset()]
    return dataclass_flags.build(ModelCfg, base)


def optim_cfg(lr: float, steps: int) -> optim.OptimCfg:
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"--steps={steps}: expected an integer >= 1 (the training steps)")
    schedule = FLAGS.schedule_steps or steps
    if schedule < 1:
        raise ConfigError(f"--schedule_steps={FLAGS.schedule_steps}: expected 0 (--steps) or an integer >= 1")
    return dataclass_flags.build(optim.OptimCfg, optim.OptimCfg(lr=lr, total_steps=schedule), prefix="opt_",
                                 skip=("lr", "total_steps"))


def mesh_cfg() -> meshlib.MeshCfg:
    return dataclass_flags.build(meshlib.MeshCfg, meshlib.MeshCfg(), prefix="mesh_")


def loop_cfg(steps: int, name: str = "train") -> loop.LoopCfg:
    if FLAGS.wandb_project and importlib.util.find_spec("wandb") is None:  # checked before the run directory exists
        raise ConfigError(f"--wandb_project={FLAGS.wandb_project} needs the wandb package (pip install wandb); "
                          f"expected it installed, or no --wandb_project")
    return dataclass_flags.build(loop.LoopCfg, loop.LoopCfg(steps=steps, name=name), skip=LOOP_SKIP,
                                 parsers=LOOP_PARSERS)


def learning_rates(program: str) -> list[float]:
    """--lr: one value or a grid of positive, finite learning rates (required)."""
    if FLAGS.lr is None:
        raise ConfigError(f"--lr is required for --program={program}")
    try:
        lrs = parse_grid("lr", FLAGS.lr)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not lrs or any(not math.isfinite(v) or v <= 0 for v in lrs):
        raise ConfigError(f"--lr={FLAGS.lr}: expected positive, finite learning rates")
    return list(lrs)


def one_lr(program: str, default: float | None = None) -> float:
    """--lr as one learning rate (`default` when not given, if there is one)."""
    if FLAGS.lr is None and default is not None:
        return default
    lrs = learning_rates(program)
    if len(lrs) != 1:
        raise ConfigError(f"--lr={FLAGS.lr}: expected one learning rate for --program={program}")
    return lrs[0]


def grid(more_lrs: tuple = ()) -> Grid:
    """The replica grid of --seed, --seeds and --gate_offset (Grid's defaults where not given), sweeping the
    optimizer's learning rate and `more_lrs`."""
    return dataclasses.replace(Grid(more_lrs=more_lrs), **dataclass_flags.overrides(
        Grid, only=("seed", "seeds", "offsets"), names=GRID_NAMES, parsers=GRID_PARSERS))


def run_spec(program: str, *, metric: str, escape_thr: float | None = None, stop_thr: float | None = None,
             lr_sweep: bool = False, model_base: ModelCfg | None = None, loop_name: str | None = None) -> RunSpec:
    """The RunSpec the shared flags describe (the program config that composes it validates it): the model,
    --opt_*, the loop, --mesh_*, the replica grid (--seed, --seeds, --lr, --gate_offset), the stop rule on
    `metric` (--escape_thr, --stop_thr; the program's defaults when not given) and --eval_n /
    --lengen_eval_n. `lr_sweep`: --lr may be a grid, one replica per learning rate; `model_base`: the model
    the flags modify (default the --preset's); `loop_name`: the progress lines' name (default the program)."""
    steps = require("steps", program)
    lrs = learning_rates(program) if lr_sweep else [one_lr(program)]
    stop = dataclasses.replace(sweep.StopRule(metric, escape_thr, stop_thr),
                               **dataclass_flags.overrides(sweep.StopRule, skip=STOP_SKIP))
    spec = RunSpec(model=model_cfg(model_base), optim=optim_cfg(lrs[0], steps),
                   loop=loop_cfg(steps, name=loop_name or program),
                   mesh=mesh_cfg(), grid=grid(tuple(lrs[1:])),
                   stop=stop, preset=preset())
    return dataclasses.replace(spec, **dataclass_flags.overrides(RunSpec, only=EVAL_FIELDS))
