"""Flags of the P1 KV-retrieval program (`--program=p1_kv`, SPEC §3) and their translation to KVRunCfg.

Task flags are `--kv_*`; `--offsets` are the gate offsets delta (Mamba-2: A_log += delta), trained with
`--seeds` seeds each at the one learning rate `--lr` as a single vmapped sweep. The model comes from
`--preset` (p1_kv_mamba2, p1_kv_gpt_neox) and the model flags, the optimizer from `--opt_*`, the loop
from `--steps`, `--eval_every`, ... (training_flags). `--escape_thr` / `--stop_thr` are the train
program's sweep flags, here with SPEC's defaults 0.95 / 0.99 when not given.
"""
from __future__ import annotations

from absl import flags

from ssmgate.programs import p1_kv
from ssmgate.programs import train_lm_flags  # defines --escape_thr, --stop_thr
from ssmgate.programs import training_flags as tf
from ssmgate.programs.config_error import ConfigError
from ssmgate.programs.grids import parse_grid
from ssmgate.tasks import kv_retrieval as kv

flags.DEFINE_enum("kv_query", "best_first", list(kv.QUERIES), "KV task: which keys are queried, the first "
                  "ceil(q n) of the context (best_first, Fig 2a/b) or the last (best_last, Fig 2c).")
flags.DEFINE_integer("kv_n_max", 512, "KV task: N, training draws n ~ U{1..N} pairs; evaluation uses n = N.")
flags.DEFINE_integer("kv_m", 8, "KV task: tokens per key and per value.")
flags.DEFINE_integer("kv_vocab", 64, "KV task: content tokens (the model vocabulary adds 5 specials).")
flags.DEFINE_integer("kv_dict_size", 10000, "KV task: (key, value) pairs of the static dictionary.")
flags.DEFINE_integer("kv_dict_seed", 0, "KV task: seed of the static dictionary (one per run).")
flags.DEFINE_float("kv_eps", 0.1, "KV task: per-token perturbation probability of in-context values.")
flags.DEFINE_float("kv_q", 0.1, "KV task: query ratio, n_q = max(1, ceil(q n)).")
flags.DEFINE_integer("kv_buckets", 8, "KV task: training length buckets over 1..N (one compiled step each).")
flags.DEFINE_string("offsets", "0", "Gate offsets delta (A_log += delta, Mamba-2), e.g. '-10,-4,-2,0,1'; "
                    "a Transformer takes '0' only.")
flags.DEFINE_integer("eval_n", 1024, "Examples of the fixed evaluation set at n = N (own seed).")
flags.DEFINE_string("lengen_ns", "", "best_last: pair counts n of the length-generalisation sets evaluated "
                    "after training (e.g. '512,768,1024'); empty = none.")
flags.DEFINE_integer("lengen_eval_n", None, "Examples per length-generalisation set (default --eval_n).")

FLAGS = flags.FLAGS
PROGRAM = "p1_kv"
ESCAPE_THR, STOP_THR = 0.95, 0.99  # SPEC 3.3 / 3.4


def int_list(name: str, text: str) -> tuple[int, ...]:
    values = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"--{name}={text}: cannot read {item!r}; expected comma-separated integers") from None
    return tuple(values)


def _or(value, default):
    return default if value is None else value


def lr_and_offsets(program: str) -> tuple[float, tuple]:
    """The one peak learning rate and the --offsets grid of a gate-offset sweep (offsets x seeds)."""
    lrs = tf.learning_rates(FLAGS.lr)
    if len(lrs) != 1:
        raise ConfigError(f"--sweep_lrs={FLAGS.sweep_lrs}: expected one learning rate for --program={program} "
                          "(the sweep is offsets x seeds)")
    try:
        return lrs[0], parse_grid("offsets", FLAGS.offsets)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def config_from_flags() -> p1_kv.KVRunCfg:
    steps, batch = tf.require("steps", PROGRAM), tf.require("batch", PROGRAM)
    lr, offsets = lr_and_offsets(PROGRAM)
    task = kv.KVCfg(n_content=FLAGS.kv_vocab, m=FLAGS.kv_m, dict_size=FLAGS.kv_dict_size, n_max=FLAGS.kv_n_max,
                    eps=FLAGS.kv_eps, q=FLAGS.kv_q, query=FLAGS.kv_query, batch=batch, dict_seed=FLAGS.kv_dict_seed)
    model = tf.model_cfg()  # validated; a bad model flag names itself
    cfg = p1_kv.KVRunCfg(
        kv=task, model=model, optim=tf.optim_cfg(lr, steps), loop=tf.loop_cfg(steps, name=PROGRAM),
        mesh=tf.mesh_cfg(), lr=lr, offsets=tuple(offsets), seeds=FLAGS.seeds, seed=FLAGS.seed,
        n_buckets=FLAGS.kv_buckets, eval_n=FLAGS.eval_n, lengen_ns=int_list("lengen_ns", FLAGS.lengen_ns),
        lengen_eval_n=FLAGS.lengen_eval_n,
        escape_thr=_or(train_lm_flags.FLAGS.escape_thr, ESCAPE_THR), stop_thr=_or(train_lm_flags.FLAGS.stop_thr, STOP_THR),
        preset=FLAGS.preset)
    return cfg.validate()


def describe(cfg) -> str:
    return p1_kv.describe(cfg)


def run(cfg, run_dir: str) -> dict:
    return p1_kv.run(cfg, run_dir)
