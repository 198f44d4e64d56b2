"""P2 state-tracking tasks (protocol §6): parity, modular counting (mod 3) and arithmetic mod 5 without brackets.

Token formats (protocol §6.1; a sequence of length L has its answer at 0-based index L - 1, PAD after):

| task   | vocab | tokens                                          | sequence                               |
|--------|-------|-------------------------------------------------|----------------------------------------|
| parity | 3     | 0 PAD, 1 bit 0, 2 bit 1                         | L - 1 bits, answer 1 + (#bit-1 mod 2)  |
| mod3   | 6     | 0 PAD, 1 bit 0, 2 bit 1, 3..5 answers 0..2      | L - 1 bits, answer 3 + (#bit-1 mod 3)  |
| arith  | 10    | 0 PAD, 1 '+', 2 '-', 3 'x', 4 '=', 5..9 = 0..4  | odd L: num op num .. op num '=' answer |

Arithmetic: numbers (token 5 + value, value uniform in 0..4) sit at even indices, operators (uniform in
{+, -, x}) at odd indices, '=' at L - 2; the answer token is 5 + (value mod 5), where 'x' binds tighter
than '+'/'-' (products of x-joined runs, then the signed sum), evaluated by a scan (`evaluate_expression`).

Causal LM framing: a batch is `LMBatch(inputs = seq[:, :-1], targets = seq[:, 1:], mask)` with mask 1
only at index L - 2, the prediction made at the last bit (or at '=') whose label is the answer, so the
framework's `synthetic_lm.lm_loss` trains on the answer alone. Training batches have static shape
(batch, max_len - 1) whatever the lengths drawn; lengths follow the curriculum of protocol §6.2
(`curriculum_max_len`); `length_bucket` (host-side) narrows a step's batch to one bucket of lengths, padded
to the bucket's top, without changing any sequence's length distribution. `sample(key, cfg, step)` is
jittable with `cfg` static and `step` traced; data for step k is `batch_for_step(cfg, seed, k)`, a function
of (seed, k) only (docs/extending.md, "The training contract").

Metrics: `answer_accuracy` (argmax at the answer slot) and `scaled_accuracy` = 100 (acc - chance) /
(1 - chance), never clipped (protocol §6.2, §10.14). `handset_phase_counter` is the analytic one-pair rotation
model of check C16 (protocol §9), built on the real core `ssmgate.cores.rotation`.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.cores.rotation import rotation
from ssmgate.tasks.synthetic_lm import LMBatch, step_key

TASKS = ("parity", "mod3", "arith")

# Token ids (protocol §6.1).
PAD = 0
BIT0, BIT1 = 1, 2                       # parity / mod 3 inputs
MOD3_ANSWER0 = 3                        # mod 3 answers 3, 4, 5 = counts 0, 1, 2
PLUS, MINUS, TIMES, EQUALS = 1, 2, 3, 4  # arithmetic operators
NUM0 = 5                                # arithmetic numbers 5..9 = values 0..4
MODULUS = 5                             # arithmetic is mod 5

VOCAB = {"parity": 3, "mod3": 6, "arith": 10}
VOCAB_SIZE = 10  # large enough for every task: one embedding table serves all three
N_CLASSES = {"parity": 2, "mod3": 3, "arith": 5}
ANSWER_TOKENS = {"parity": (1, 2), "mod3": (3, 4, 5), "arith": (5, 6, 7, 8, 9)}
# Uniform chance of the answer (protocol §10.14): the scaled-accuracy baseline.
CHANCE = {"parity": 1 / 2, "mod3": 1 / 3, "arith": 1 / 5}
# The curriculum ramps over the first 6,000 of 10,000 steps for parity / mod 3 and over all 10,000
# for arithmetic (protocol §6.2).
PAPER_RAMP_STEPS = {"parity": 6000, "mod3": 6000, "arith": 10000}
TEST_LEN = 224  # protocol §6.2 / §10.13


def _check_task(task: str, where: str = "task") -> None:
    if task not in TASKS:
        raise ValueError(f"{where}={task!r}: expected one of {TASKS}")


def min_length(task: str) -> int:
    """The shortest valid sequence: one bit + answer (parity, mod 3); 'num = answer' (arith)."""
    _check_task(task)
    return 3 if task == "arith" else 2


def valid_length(task: str, length: int) -> int:
    """The longest valid sequence length <= `length`: arithmetic needs odd lengths, so 224 -> 223 (the
    [X] generators' rounding); the counting tasks take any length. Raises if none exists."""
    _check_task(task)
    out = length - 1 if task == "arith" and length % 2 == 0 else length
    if out < min_length(task):
        raise ValueError(f"length={length}: {task} needs a sequence length >= {min_length(task)}")
    return out


@dataclasses.dataclass(frozen=True)
class StateTrackDataCfg:
    """The data side of protocol §0.2 `StateTrackCfg` (the model side lives with the program).

    task: parity | mod3 | arith. batch: sequences per step. max_len: every training sequence is padded
    to this many tokens, so a batch's arrays are (batch, max_len - 1) at every step (static shapes).
    Curriculum (protocol §6.2): the length is drawn from U{L_min .. L_max(step)} (odd lengths only for
    arith), L_max growing linearly from L_max0 to L_max1 over ramp_steps steps, then fixed. hold_steps
    (0 in the the protocol's protocol) keeps L_max at L_max0 that many steps before the ramp starts: short
    CPU runs use it to give the rotation time to be found on the shortest sequences first.
    """

    task: str = "parity"
    batch: int = 256
    max_len: int = 160
    L_min: int = 3
    L_max0: int = 40
    L_max1: int = 160
    ramp_steps: int = 6000
    hold_steps: int = 0

    @classmethod
    def paper(cls, task: str, **overrides) -> "StateTrackDataCfg":
        """protocol §6.2: batch 256, lengths 3 .. 40 -> 160, ramp 6,000 (parity, mod 3) or 10,000 (arith)."""
        _check_task(task)
        return cls(**{"task": task, "ramp_steps": PAPER_RAMP_STEPS[task], **overrides}).validate()

    def validate(self) -> "StateTrackDataCfg":
        _check_task(self.task)
        for name in ("batch", "max_len", "L_min", "L_max0", "L_max1", "ramp_steps", "hold_steps"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ValueError(f"{name}={v!r}: expected an int")
        if self.batch < 1:
            raise ValueError(f"batch={self.batch}: expected >= 1")
        lo = min_length(self.task)
        if self.L_min < lo:
            raise ValueError(f"L_min={self.L_min}: expected >= {lo} for task {self.task!r}")
        if self.task == "arith" and self.L_min % 2 == 0:
            raise ValueError(f"L_min={self.L_min}: arith sequences have odd lengths; expected an odd L_min >= 3")
        if self.L_max0 < self.L_min:
            raise ValueError(f"L_max0={self.L_max0}: expected >= L_min = {self.L_min}")
        if self.L_max1 < self.L_max0:
            raise ValueError(f"L_max1={self.L_max1}: expected >= L_max0 = {self.L_max0} "
                             "(the curriculum only grows)")
        if self.max_len < self.L_max1:
            raise ValueError(f"max_len={self.max_len}: expected >= L_max1 = {self.L_max1} "
                             "(the padded length must hold the longest sequence)")
        if self.ramp_steps < 0:
            raise ValueError(f"ramp_steps={self.ramp_steps}: expected >= 0 (0 = no ramp, L_max1 from step 0)")
        if self.hold_steps < 0:
            raise ValueError(f"hold_steps={self.hold_steps}: expected >= 0 (0 = the ramp starts at step 0)")
        if (self.L_max1 - self.L_max0) * self.ramp_steps >= 2**31:
            raise ValueError(f"ramp_steps={self.ramp_steps}: expected (L_max1 - L_max0) * ramp_steps < 2**31 "
                             "(the schedule is computed in int32)")
        return self


def curriculum_max_len(cfg: StateTrackDataCfg, step):
    """L_max(step) = L_max0 + floor((L_max1 - L_max0) clip(step - hold_steps, 0, ramp_steps) / ramp_steps)
    (protocol §6.2 with hold_steps = 0); int32, jittable in `step`. ramp_steps = 0 gives L_max0 during the
    hold and L_max1 after it."""
    step = jnp.asarray(step, jnp.int32) - cfg.hold_steps
    if cfg.ramp_steps == 0:
        return jnp.where(step < 0, cfg.L_max0, cfg.L_max1).astype(jnp.int32)
    s = jnp.clip(step, 0, cfg.ramp_steps)
    return (cfg.L_max0 + (cfg.L_max1 - cfg.L_max0) * s // cfg.ramp_steps).astype(jnp.int32)


def _draw_lengths(key, cfg: StateTrackDataCfg, step, lo: int | None = None, width: int | None = None):
    """(batch,) int32 lengths, uniform on the valid lengths (odd only for arith) in
    {max(L_min, lo) .. min(L_max(step), width)}; lo, width static (None: no bound). The caller makes
    sure that range holds a valid length (`length_bucket` does)."""
    hi = curriculum_max_len(cfg, step)
    if width is not None:
        hi = jnp.minimum(hi, width)
    lo = cfg.L_min if lo is None else max(cfg.L_min, int(lo))
    if cfg.task != "arith":
        return jax.random.randint(key, (cfg.batch,), lo, hi + 1, jnp.int32)
    lo += 1 - lo % 2                            # the first odd length >= lo
    hi_odd = hi - (1 - hi % 2)                  # hi_odd >= lo: L_min is odd (validate) / the bucket holds one
    n_odd = (hi_odd - lo) // 2 + 1
    return lo + 2 * jax.random.randint(key, (cfg.batch,), 0, n_odd, jnp.int32)


def evaluate_expression(expr_bl, n_tokens_b):
    """Value mod 5 (int32 (b,), in 0..4) of each row's expression `num op num .. op num`.

    expr_bl (b, l) int32 holds number tokens (5 + value) at even and operator tokens (1 '+', 2 '-',
    3 'x') at odd indices; row i uses its first n_tokens_b[i] (odd) tokens, the rest is ignored.
    'x' binds tighter than '+'/'-': a scan over (op, num) keeps the running signed sum and the running
    product of the current x-run, all mod 5 (protocol §6.1).
    """
    nums_bk = expr_bl[:, 0::2].astype(jnp.int32) - NUM0
    k_max = nums_bk.shape[1]
    ops_bk = expr_bl[:, 1::2].astype(jnp.int32)[:, : k_max - 1]
    n_nums_b = (jnp.asarray(n_tokens_b, jnp.int32) + 1) // 2
    b = expr_bl.shape[0]

    def body(carry, xs):
        total, sign, term = carry  # sign in {1, 4}: +1 and -1 mod 5, so everything stays non-negative
        num, op, k = xs
        valid = k < n_nums_b
        times = op == TIMES
        new_total = jnp.where(times, total, (total + sign * term) % MODULUS)
        new_sign = jnp.where(times, sign, jnp.where(op == MINUS, MODULUS - 1, 1))
        new_term = jnp.where(times, term * num % MODULUS, num)
        keep = lambda new, old: jnp.where(valid, new, old)
        return (keep(new_total, total), keep(new_sign, sign), keep(new_term, term)), None

    init = (jnp.zeros((b,), jnp.int32), jnp.ones((b,), jnp.int32), nums_bk[:, 0] % MODULUS)
    ks = jnp.arange(1, k_max, dtype=jnp.int32)
    (total, sign, term), _ = jax.lax.scan(body, init, (nums_bk[:, 1:].T, ops_bk.T, ks))
    return (total + sign * term) % MODULUS


def _sequences(key, task: str, lengths_b, width: int):
    """(b, width) int32 sequences of the given lengths in the §6.1 format, PAD after each answer."""
    b = lengths_b.shape[0]
    pos = jnp.arange(width, dtype=jnp.int32)[None, :]
    L = lengths_b[:, None]
    if task in ("parity", "mod3"):
        bits = jnp.where(jax.random.bernoulli(key, 0.5, (b, width)), BIT1, BIT0).astype(jnp.int32)
        body = jnp.where(pos < L - 1, bits, PAD)
        ones = jnp.sum(body == BIT1, axis=1, dtype=jnp.int32)
        answer = BIT0 + ones % 2 if task == "parity" else MOD3_ANSWER0 + ones % 3
    else:
        k_num, k_op = jax.random.split(key)
        nums = jax.random.randint(k_num, (b, width), 0, MODULUS, jnp.int32)
        ops = jax.random.randint(k_op, (b, width), PLUS, TIMES + 1, jnp.int32)
        raw = jnp.where(pos % 2 == 0, NUM0 + nums, ops)
        body = jnp.where(pos < L - 2, raw, jnp.where(pos == L - 2, EQUALS, PAD))
        answer = NUM0 + evaluate_expression(raw, lengths_b - 2)
    return jnp.where(pos == L - 1, answer[:, None], body).astype(jnp.int32)


def _lm_batch(seq_bl, lengths_b) -> LMBatch:
    pos = jnp.arange(seq_bl.shape[1] - 1, dtype=jnp.int32)[None, :]
    mask = (pos == lengths_b[:, None] - 2).astype(jnp.float32)
    return LMBatch(seq_bl[:, :-1], seq_bl[:, 1:], mask)


def sample(key, cfg: StateTrackDataCfg, step, width: int | None = None, lo: int | None = None) -> LMBatch:
    """A training batch of step `step` (protocol §6.2): lengths ~ U{L_min .. L_max(step)}, padded to
    `width` (default cfg.max_len); arrays (cfg.batch, width - 1). Jittable with cfg, width and lo
    static, step traced. Without `lo`, a narrower width must hold L_max(step): take it from
    `curriculum_width`. With `lo` (a length bucket, from `length_bucket`), the lengths are uniform on
    {max(L_min, lo) .. min(L_max(step), width)} instead."""
    cfg.validate()
    width = cfg.max_len if width is None else width
    if not isinstance(width, (int, np.integer)) or not cfg.L_min <= width <= cfg.max_len:
        raise ValueError(f"width={width!r}: expected an int in [L_min, max_len] = [{cfg.L_min}, {cfg.max_len}]")
    if lo is not None and (not isinstance(lo, (int, np.integer)) or not 1 <= lo <= width):
        raise ValueError(f"lo={lo!r}: expected None or an int in [1, width] = [1, {width}]")
    k_len, k_seq = jax.random.split(key)
    lengths = _draw_lengths(k_len, cfg, step, lo, None if lo is None else width)
    return _lm_batch(_sequences(k_seq, cfg.task, lengths, width), lengths)


def curriculum_width(cfg: StateTrackDataCfg, step: int, quantum: int) -> int:
    """The padded width of step `step` (host-side): the smallest multiple of `quantum` that holds
    L_max(step), at most cfg.max_len; quantum 0 = always max_len. Early curriculum steps then cost
    their short lengths instead of the longest one, with one compilation per width."""
    if not isinstance(quantum, (int, np.integer)) or quantum < 0:
        raise ValueError(f"quantum={quantum!r}: expected an int >= 0 (0 = no staging)")
    if quantum == 0:
        return cfg.max_len
    longest = int(curriculum_max_len(cfg, int(step)))
    return min(cfg.max_len, -(-longest // quantum) * quantum)


BUCKET_SALT = 620  # length_bucket's host draw: independent of other host draws from (seed, step)


def length_bucket(cfg: StateTrackDataCfg, step: int, quantum: int, seed: int) -> tuple[int, int]:
    """The length bucket (lo, width) of step `step` (host-side, a function of (seed, step) only).

    The valid lengths L_min .. L_max(step) (odd only for arith) are cut at the multiples of `quantum`;
    the step's bucket is the one holding v ~ U{valid lengths} drawn from (seed, step), and
    `sample(.., width, lo)` then draws every length of the batch uniformly inside it. Each sequence's
    length is therefore still exactly U{L_min .. L_max(step)}, but a batch is padded to its bucket's
    top instead of to L_max(step): with L_max = 4 quanta, 5/8 of the tokens instead of all of them.
    A batch's lengths are then alike (one bucket), which the iid batches of protocol §6.2 are not."""
    if not isinstance(quantum, (int, np.integer)) or quantum < 1:
        raise ValueError(f"quantum={quantum!r}: expected an int >= 1")
    hi = int(curriculum_max_len(cfg, int(step)))
    valid = np.arange(cfg.L_min, hi + 1, 2 if cfg.task == "arith" else 1)
    v = int(np.random.default_rng([int(seed), int(step), BUCKET_SALT]).choice(valid))
    top = -(-v // quantum) * quantum
    return top - quantum + 1, min(cfg.max_len, top)


def batch_for_step(cfg: StateTrackDataCfg, seed: int, step) -> LMBatch:
    """The batch of step `step` of a run seeded `seed`: a function of (seed, step) only."""
    return sample(step_key(seed, step), cfg, step)


def sample_fixed_length(key, cfg: StateTrackDataCfg, length: int, n: int) -> LMBatch:
    """n sequences of exactly `length` tokens (validation/test sets, e.g. 224; protocol §6.2), arrays
    (n, length - 1). Only cfg.task is used. Arithmetic needs an odd length: see `valid_length`."""
    _check_task(cfg.task, "cfg.task")
    if not isinstance(length, (int, np.integer)) or length < min_length(cfg.task):
        raise ValueError(f"length={length!r}: expected an int >= {min_length(cfg.task)} for task {cfg.task!r}")
    if cfg.task == "arith" and length % 2 == 0:
        raise ValueError(f"length={length}: arith sequences have odd lengths; expected an odd length "
                         f"(valid_length('arith', {length}) = {length - 1})")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n={n!r}: expected an int >= 1")
    lengths = jnp.full((n,), length, jnp.int32)
    return _lm_batch(_sequences(key, cfg.task, lengths, length), lengths)


def answer_slot(batch: LMBatch):
    """(b,) int32: the index of each row's scored label (L - 2 for a sequence of length L)."""
    return jnp.argmax(batch.mask, axis=1).astype(jnp.int32)


def answer_accuracy(logits_btv, batch: LMBatch):
    """Fraction of rows whose argmax at the answer slot is the answer token (all positions with mask 1
    are scored; the generators put exactly one per row)."""
    correct = (jnp.argmax(logits_btv, axis=-1) == batch.targets).astype(jnp.float32)
    return (correct * batch.mask).sum() / jnp.maximum(batch.mask.sum(), 1.0)


def scaled_accuracy(acc, task: str):
    """100 (acc - chance) / (1 - chance) with uniform chance 0.5 / 1/3 / 0.2 (protocol §6.2, §10.14).
    Not clipped: below-chance accuracy gives a negative score. Works on floats and arrays."""
    _check_task(task)
    chance = CHANCE[task]
    return 100.0 * (acc - chance) / (1.0 - chance)


TRANSITIONS = ("rotation", "constant", "decay")


def handset_phase_counter(inputs_bt, task: str, *, transition: str = "rotation", decay: float = 0.05,
                          algorithm: str = "sequential"):
    """Check C16 (protocol §9): the answer token predicted after every input token, (b, t) int32, by a
    hand-set one-pair recurrence run with the real core `ssmgate.cores.rotation`.

    One head, p = 1, n = 2 (one rotated pair), dt = 1, x = 1. A start position (token PAD, no
    rotation) is prepended and is the only one that writes, B = (1, 0); every later B is 0. With
    m = 2 (parity) or 3 (mod 3), per token:
    - transition="rotation": A = 0 (no decay), theta = (2 pi / m) [token = bit 1];
    - transition="constant": A = 0, theta = 2 pi / m at every token (input-independent rotation);
    - transition="decay":    theta = 0 (no rotation), A = -decay [token = bit 1] (a real positive
      transition exp(A) in (0, 1] that depends on the input).
    Readout by nearest phase: reading C = (1, 0) and C = (0, 1) gives cos and -sin of the phase
    travelled since the write, psi; the count is round(psi m / 2 pi) mod m and the token is the
    task's answer token for it. Only "rotation" can track the count (100% at any length); the others
    predict the same token for every input (chance).
    """
    if task not in ("parity", "mod3"):
        raise ValueError(f"task={task!r}: the phase counter solves counting tasks; expected 'parity' or 'mod3'")
    if transition not in TRANSITIONS:
        raise ValueError(f"transition={transition!r}: expected one of {TRANSITIONS}")
    if not decay > 0:
        raise ValueError(f"decay={decay!r}: expected > 0 (a real transition exp(-decay) < 1)")
    m = N_CLASSES[task]
    angle = 2.0 * math.pi / m
    tokens_bt = jnp.pad(jnp.asarray(inputs_bt, jnp.int32), ((0, 0), (1, 0)), constant_values=PAD)
    b, t = tokens_bt.shape
    one_bt = (tokens_bt == BIT1).astype(jnp.float32)
    if transition == "rotation":
        theta_bt, A = angle * one_bt, jnp.zeros((1,), jnp.float32)
    elif transition == "constant":
        theta_bt, A = jnp.full((b, t), angle, jnp.float32), jnp.zeros((1,), jnp.float32)
    else:
        theta_bt, A = jnp.zeros((b, t), jnp.float32), (-decay * one_bt)[..., None]
    x = jnp.ones((b, t, 1, 1), jnp.float32)
    dt = jnp.ones((b, t, 1), jnp.float32)
    B = jnp.zeros((b, t, 1, 2), jnp.float32).at[:, 0, 0, 0].set(1.0)
    theta = theta_bt[..., None, None]

    def read(c_vec):
        C = jnp.broadcast_to(jnp.asarray(c_vec, jnp.float32), (b, t, 1, 2))
        y, _ = rotation(x, dt, A, B, C, theta, algorithm=algorithm)
        return y[:, 1:, 0, 0]  # drop the start position: one prediction per input token

    cos_psi, neg_sin_psi = read((1.0, 0.0)), read((0.0, 1.0))
    psi = jnp.arctan2(-neg_sin_psi, cos_psi)
    count = jnp.round(psi * m / (2.0 * math.pi)).astype(jnp.int32) % m
    return (ANSWER_TOKENS[task][0] + count).astype(jnp.int32)
