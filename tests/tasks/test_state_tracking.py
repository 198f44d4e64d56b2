"""The P2 state-tracking generators and metrics (protocol §6.1, §6.2) and checks C16, C20 (protocol §9)."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.tasks import state_tracking as st
from ssmgate.tasks.synthetic_lm import LMBatch, lm_loss

OP_CHARS = {st.PLUS: "+", st.MINUS: "-", st.TIMES: "*"}
# Jitted once per configuration (cfg, length and n are static): far cheaper than op-by-op dispatch.
_sample = jax.jit(st.sample, static_argnums=1)
_fixed = jax.jit(st.sample_fixed_length, static_argnums=(1, 2, 3))


def _np(batch: LMBatch):
    return tuple(np.asarray(a) for a in batch)


def _lengths(batch: LMBatch) -> np.ndarray:
    return np.asarray(st.answer_slot(batch)) + 2


def _python_value(tokens) -> int:
    """Plain-Python reference: the expression as a string, evaluated by Python (x binds tighter), mod 5."""
    text = "".join(str(t - st.NUM0) if i % 2 == 0 else OP_CHARS[t] for i, t in enumerate(tokens))
    return eval(text) % 5  # noqa: S307 -- digits and + - * only


# --- configuration -------------------------------------------------------------------------------

def test_paper_cfg_follows_spec():
    for task, ramp in (("parity", 6000), ("mod3", 6000), ("arith", 10000)):
        cfg = st.StateTrackDataCfg.paper(task)
        assert (cfg.batch, cfg.L_min, cfg.L_max0, cfg.L_max1, cfg.ramp_steps) == (256, 3, 40, 160, ramp)
        assert cfg.max_len >= cfg.L_max1
    assert st.VOCAB == {"parity": 3, "mod3": 6, "arith": 10} and st.VOCAB_SIZE == 10
    assert st.CHANCE["parity"] == 0.5 and st.CHANCE["mod3"] == 1 / 3 and st.CHANCE["arith"] == 0.2


@pytest.mark.parametrize("override, match", [
    (dict(task="arith5"), r"task='arith5': expected one of \('parity', 'mod3', 'arith'\)"),
    (dict(batch=0), r"batch=0: expected >= 1"),
    (dict(L_min=1), r"L_min=1: expected >= 2"),
    (dict(task="arith", L_min=4), r"L_min=4: arith sequences have odd lengths"),
    (dict(L_max0=2), r"L_max0=2: expected >= L_min = 3"),
    (dict(L_max1=30), r"L_max1=30: expected >= L_max0 = 40"),
    (dict(max_len=100), r"max_len=100: expected >= L_max1 = 160"),
    (dict(ramp_steps=-1), r"ramp_steps=-1: expected >= 0"),
    (dict(hold_steps=-2), r"hold_steps=-2: expected >= 0"),
    (dict(batch=2.0), r"batch=2.0: expected an int"),
    (dict(ramp_steps=10**8), r"ramp_steps=100000000: expected \(L_max1 - L_max0\) \* ramp_steps < 2\*\*31"),
])
def test_cfg_validate_names_the_bad_field(override, match):
    with pytest.raises(ValueError, match=match):
        st.StateTrackDataCfg(**override).validate()


# --- token formats ------------------------------------------------------------------------------

@pytest.mark.parametrize("task", ["parity", "mod3"])
def test_counting_token_format_and_answer(task):
    cfg = st.StateTrackDataCfg.paper(task, batch=512, max_len=50, L_max0=50, L_max1=50)
    batch = _sample(jax.random.key(1), cfg, 0)
    inputs, targets, mask = _np(batch)
    assert inputs.shape == targets.shape == mask.shape == (512, 49)
    assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == np.float32
    first = 1 if task == "parity" else 3
    m = 2 if task == "parity" else 3
    seen_answers = set()
    for row_in, row_tg, L in zip(inputs, targets, _lengths(batch)):
        seq = np.concatenate([row_in, row_tg[-1:]])       # the whole padded sequence
        bits, answer, pad = seq[: L - 1], seq[L - 1], seq[L:]
        assert set(bits.tolist()) <= {st.BIT0, st.BIT1}
        assert answer == first + np.sum(bits == st.BIT1) % m
        assert np.all(pad == st.PAD)
        assert row_tg[L - 2] == answer and row_in[L - 2] in (st.BIT0, st.BIT1)  # predicted at the last bit
        seen_answers.add(int(answer))
    assert seen_answers == set(st.ANSWER_TOKENS[task])
    assert inputs.max() < st.VOCAB[task] and targets.max() < st.VOCAB[task]


def test_arith_token_format():
    cfg = st.StateTrackDataCfg.paper("arith", batch=512, max_len=41, L_max0=41, L_max1=41)
    batch = _sample(jax.random.key(2), cfg, 0)
    inputs, targets, _ = _np(batch)
    lengths = _lengths(batch)
    assert np.all(lengths % 2 == 1)
    for row_in, row_tg, L in zip(inputs, targets, lengths):
        seq = np.concatenate([row_in, row_tg[-1:]])
        assert np.all((seq[0: L - 2: 2] >= st.NUM0) & (seq[0: L - 2: 2] <= 9))   # numbers at even indices
        assert set(seq[1: L - 2: 2].tolist()) <= {st.PLUS, st.MINUS, st.TIMES}  # operators at odd indices
        assert seq[L - 2] == st.EQUALS and st.NUM0 <= seq[L - 1] <= 9
        assert np.all(seq[L:] == st.PAD)
        assert row_in[L - 2] == st.EQUALS and row_tg[L - 2] == seq[L - 1]       # predicted at '='
    body = np.concatenate([np.concatenate([i, t[-1:]])[: L - 2] for i, t, L in zip(inputs, targets, lengths)])
    ops = body[(body >= 1) & (body <= 3)]
    assert np.all(np.abs(np.bincount(ops, minlength=4)[1:] / len(ops) - 1 / 3) < 0.03)  # uniform operators


# --- arithmetic with precedence -----------------------------------------------------------------

def test_evaluate_expression_hand_cases():
    cases = ["2+3*4", "2-3*4", "4*4*4-1", "1-2-3", "3", "0*4+2*2*2-4", "4-4*4*4*4*4"]
    tok = {"+": st.PLUS, "-": st.MINUS, "*": st.TIMES}
    width = max(map(len, cases))
    expr = np.zeros((len(cases), width), np.int32)
    for i, c in enumerate(cases):
        expr[i, : len(c)] = [st.NUM0 + int(ch) if ch.isdigit() else tok[ch] for ch in c]
        expr[i, len(c):] = st.NUM0 + 4  # junk past the expression must be ignored
    got = st.evaluate_expression(jnp.asarray(expr), jnp.asarray([len(c) for c in cases]))
    np.testing.assert_array_equal(got, [eval(c) % 5 for c in cases])  # noqa: S307


def test_arith_answers_match_python_reference():
    cfg = st.StateTrackDataCfg.paper("arith", batch=400, max_len=161, L_max0=161, L_max1=161)
    rows = []
    for batch in (_sample(jax.random.key(3), cfg, 0), _fixed(jax.random.key(4), cfg, 223, 100)):
        inputs, targets, _ = _np(batch)
        rows += [(i[: L - 2], t[L - 2]) for i, t, L in zip(inputs, targets, _lengths(batch))]
    assert len(rows) == 500
    answers = [int(ans) - st.NUM0 for _, ans in rows]
    assert answers == [_python_value(expr.tolist()) for expr, _ in rows]
    assert np.all(np.abs(np.bincount(answers, minlength=5) / len(answers) - 0.2) < 0.06)


# --- curriculum and lengths ---------------------------------------------------------------------

def test_curriculum_schedule():
    cfg = st.StateTrackDataCfg.paper("parity")
    f = jax.jit(functools.partial(st.curriculum_max_len, cfg))
    schedule = ((0, 40), (1, 40), (50, 41), (3000, 100), (5999, 159), (6000, 160), (9999, 160), (10**6, 160))
    for step, want in schedule:
        assert int(f(step)) == want == int(st.curriculum_max_len(cfg, step))
    steps = np.arange(0, 7000, 7)
    lmax = np.asarray(jax.vmap(f)(steps))
    assert np.all(np.diff(lmax) >= 0) and lmax[0] == 40 and lmax[-1] == 160
    assert int(st.curriculum_max_len(st.StateTrackDataCfg.paper("arith"), 5000)) == 100
    assert int(st.curriculum_max_len(st.StateTrackDataCfg(ramp_steps=0), 0)) == 160


def test_curriculum_hold_delays_the_ramp():
    cfg = st.StateTrackDataCfg(L_max0=4, L_max1=128, max_len=128, ramp_steps=800, hold_steps=400)
    f = jax.jit(functools.partial(st.curriculum_max_len, cfg))
    for step, want in ((0, 4), (399, 4), (400, 4), (401, 4), (407, 5), (800, 66), (1200, 128), (5000, 128)):
        assert int(f(step)) == want == int(st.curriculum_max_len(cfg, step))
    # the hold shifts the protocol schedule by hold_steps, nothing else
    plain = dataclasses.replace(cfg, hold_steps=0)
    assert all(int(f(k + 400)) == int(st.curriculum_max_len(plain, k)) for k in range(0, 1000, 37))
    # no ramp: L_max0 during the hold, L_max1 after it
    jump = dataclasses.replace(cfg, ramp_steps=0)
    assert [int(st.curriculum_max_len(jump, k)) for k in (0, 399, 400, 401)] == [4, 4, 128, 128]
    assert st.curriculum_width(cfg, 399, 32) == 32 and st.curriculum_width(cfg, 1200, 32) == 128


@pytest.mark.parametrize("task", ["parity", "arith"])
def test_lengths_uniform_within_curriculum_bounds(task):
    cfg = st.StateTrackDataCfg.paper(task, batch=8000)
    for step in (0, cfg.ramp_steps // 2, 2 * cfg.ramp_steps):
        batch = _sample(jax.random.key(5), cfg, step)
        assert batch.inputs.shape == (8000, cfg.max_len - 1)  # static shape at every step
        lengths = _lengths(batch)
        hi = int(st.curriculum_max_len(cfg, step))
        allowed = np.arange(3, hi + 1) if task == "parity" else np.arange(3, hi + 1, 2)
        assert set(np.unique(lengths).tolist()) == set(allowed.tolist())  # every allowed length, nothing else
        counts = np.array([np.sum(lengths == v) for v in allowed])
        expect = len(lengths) / len(allowed)
        assert np.all(np.abs(counts - expect) < 5 * np.sqrt(expect))


def test_curriculum_width_stages_hold_the_longest_length():
    cfg = st.StateTrackDataCfg.paper("parity", batch=64)  # L_max 40 -> 160 over 6000 steps
    assert [st.curriculum_width(cfg, k, 32) for k in (0, 1, 2999, 3000, 5999, 10**5)] == [64, 64, 128, 128, 160, 160]
    assert st.curriculum_width(cfg, 0, 0) == 160 and st.curriculum_width(cfg, 0, 7) == 42
    for step in (0, 1000, 4000, 7000):
        width = st.curriculum_width(cfg, step, 32)
        batch = jax.jit(st.sample, static_argnums=(1, 3))(jax.random.key(2), cfg, step, width)
        assert batch.inputs.shape == (64, width - 1)
        assert width >= int(st.curriculum_max_len(cfg, step)) >= _lengths(batch).max()
        np.testing.assert_array_equal(np.asarray(batch.mask).sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="quantum=-1"):
        st.curriculum_width(cfg, 0, -1)
    with pytest.raises(ValueError, match=r"width=200: expected an int in \[L_min, max_len\] = \[3, 160\]"):
        st.sample(jax.random.key(0), cfg, 0, 200)


def test_mask_padding_and_lm_loss():
    cfg = st.StateTrackDataCfg.paper("mod3", batch=64, L_max0=160)
    batch = _sample(jax.random.key(6), cfg, 123)
    inputs, targets, mask = _np(batch)
    lengths = _lengths(batch)
    np.testing.assert_array_equal(mask.sum(axis=1), 1.0)                      # exactly one scored label
    np.testing.assert_array_equal(mask, (np.arange(159)[None] == lengths[:, None] - 2).astype(np.float32))
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])             # causal shift
    pos = np.arange(159)[None]
    assert np.all(inputs[pos >= lengths[:, None]] == st.PAD)
    assert np.all(targets[pos >= lengths[:, None] - 1] == st.PAD)
    # The framework's loss trains only the answer: perfect answers and garbage elsewhere score 1, loss ~ 0.
    logits = 30.0 * jax.nn.one_hot(batch.targets, st.VOCAB_SIZE) * batch.mask[..., None]
    loss, metrics = lm_loss(logits, batch)
    assert float(loss) < 1e-6 and float(metrics["accuracy"]) == 1.0
    assert float(st.answer_accuracy(logits, batch)) == 1.0


def test_data_depends_only_on_seed_and_step():
    # Eager and jitted sampling agree (parity: cheap op-by-op); a step's batch is a function of (seed, step).
    cfg = st.StateTrackDataCfg.paper("parity", batch=32)
    for x, y in zip(st.batch_for_step(cfg, 7, 4321), jax.jit(lambda s: st.batch_for_step(cfg, 7, s))(4321)):
        np.testing.assert_array_equal(x, y)
    cfg = st.StateTrackDataCfg.paper("arith", batch=32)
    f = jax.jit(lambda seed, step: st.batch_for_step(cfg, seed, step))
    a, again = f(7, 4321), f(7, 4321)
    for x, y in zip(a, again):
        np.testing.assert_array_equal(x, y)
    for other in (f(7, 4322), f(8, 4321)):
        assert not np.array_equal(a.inputs, other.inputs)


def test_sample_fixed_length():
    for task, length in (("parity", 224), ("mod3", 224), ("arith", 223)):
        batch = _fixed(jax.random.key(8), st.StateTrackDataCfg(task=task), length, 16)
        assert batch.inputs.shape == (16, length - 1)
        np.testing.assert_array_equal(_lengths(batch), length)
        assert np.all(np.asarray(batch.inputs) != st.PAD)  # no padding at the full length
    assert st.valid_length("arith", 224) == 223 and st.valid_length("parity", 224) == 224
    assert st.valid_length("arith", 3) == 3 and st.valid_length("mod3", 2) == 2
    with pytest.raises(ValueError, match=r"length=2: arith needs a sequence length >= 3"):
        st.valid_length("arith", 2)
    with pytest.raises(ValueError, match=r"length=224: arith sequences have odd lengths.*= 223"):
        st.sample_fixed_length(jax.random.key(0), st.StateTrackDataCfg(task="arith"), 224, 4)
    with pytest.raises(ValueError, match=r"length=1: expected an int >= 2"):
        st.sample_fixed_length(jax.random.key(0), st.StateTrackDataCfg(), 1, 4)
    with pytest.raises(ValueError, match=r"n=0: expected an int >= 1"):
        st.sample_fixed_length(jax.random.key(0), st.StateTrackDataCfg(), 10, 0)


# --- metrics (C20) ------------------------------------------------------------------------------

def test_scaled_accuracy_values():
    for task in st.TASKS:
        assert st.scaled_accuracy(st.CHANCE[task], task) == pytest.approx(0.0, abs=1e-12)
        assert st.scaled_accuracy(1.0, task) == pytest.approx(100.0)
    assert st.scaled_accuracy(0.75, "parity") == pytest.approx(50.0)
    assert st.scaled_accuracy(0.0, "arith") == pytest.approx(-25.0)  # below chance: negative, not clipped
    with pytest.raises(ValueError, match=r"task='arith5'"):
        st.scaled_accuracy(0.5, "arith5")


@pytest.mark.parametrize("task", st.TASKS)
def test_c20_random_and_perfect_predictions(task):
    cfg = st.StateTrackDataCfg(task=task)
    batch = _fixed(jax.random.key(9), cfg, 3, 200_000)
    # Uniform guesses among the task's answer tokens (logit -inf elsewhere).
    classes = jnp.asarray(st.ANSWER_TOKENS[task])
    noise = jax.random.normal(jax.random.key(10), batch.inputs.shape + (len(classes),))
    logits = jnp.full(batch.inputs.shape + (st.VOCAB_SIZE,), -jnp.inf).at[..., classes].set(noise)
    random_score = float(st.scaled_accuracy(st.answer_accuracy(logits, batch), task))
    assert abs(random_score) < 1.0
    perfect = jax.nn.one_hot(batch.targets, st.VOCAB_SIZE)
    assert float(st.scaled_accuracy(st.answer_accuracy(perfect, batch), task)) == pytest.approx(100.0)


# --- C16: the analytic one-pair rotation counter ------------------------------------------------

T_C16 = 10_000


@pytest.mark.parametrize("task", ["parity", "mod3"])
def test_c16_rotation_counter_is_exact_at_10k(task):
    cfg = st.StateTrackDataCfg(task=task)
    batch = _fixed(jax.random.key(11), cfg, T_C16 + 1, 32)  # 10,000 bits, then the answer
    assert batch.inputs.shape == (32, T_C16)
    pred = jax.jit(st.handset_phase_counter, static_argnames=("task",))(batch.inputs, task=task)
    logits = jax.nn.one_hot(pred, st.VOCAB[task])
    assert float(st.answer_accuracy(logits, batch)) == 1.0
    assert float(st.scaled_accuracy(st.answer_accuracy(logits, batch), task)) == pytest.approx(100.0)
    # It tracks the count after every prefix, not only at the end.
    m = st.N_CLASSES[task]
    want = st.ANSWER_TOKENS[task][0] + np.cumsum(np.asarray(batch.inputs) == st.BIT1, axis=1) % m
    np.testing.assert_array_equal(pred, want)


@functools.partial(jax.jit, static_argnames=("task", "transition"))
def _last_prediction(inputs, task, transition):
    return st.handset_phase_counter(inputs, task, transition=transition)[:, -1]


@pytest.mark.parametrize("task", ["parity", "mod3"])
def test_c16_constant_rotation_or_real_decay_is_at_chance(task):
    cfg = st.StateTrackDataCfg(task=task)
    n_chunks, chunk = 2, 512  # 1,024 random sequences: chance + 0.04 is > 2.5 standard errors
    batches = [_fixed(k, cfg, T_C16 + 1, chunk) for k in jax.random.split(jax.random.key(12), n_chunks)]
    answers = np.concatenate([np.asarray(b.targets[:, -1]) for b in batches])
    for transition in ("constant", "decay"):
        pred = np.concatenate([np.asarray(_last_prediction(b.inputs, task, transition)) for b in batches])
        assert len(np.unique(pred)) == 1  # the same answer whatever the input: no state is tracked
        acc = float(np.mean(pred == answers))
        assert acc <= st.CHANCE[task] + 0.04, (transition, acc)


def test_handset_counter_errors():
    x = jnp.ones((1, 4), jnp.int32)
    with pytest.raises(ValueError, match=r"task='arith'.*expected 'parity' or 'mod3'"):
        st.handset_phase_counter(x, "arith")
    with pytest.raises(ValueError, match=r"transition='damped': expected one of"):
        st.handset_phase_counter(x, "parity", transition="damped")
    with pytest.raises(ValueError, match=r"decay=0.0: expected > 0"):
        st.handset_phase_counter(x, "parity", transition="decay", decay=0.0)


@pytest.mark.parametrize("task", ["parity", "arith"])
def test_length_buckets_keep_every_length_uniform(task):
    # Mid-ramp L_max = 75 (arith: odd lengths 3..75), buckets of 32 lengths: 1..32, 33..64, 65..96.
    cfg = st.StateTrackDataCfg(task=task, batch=4096, max_len=96, L_min=3, L_max0=11, L_max1=96, ramp_steps=85)
    step = 64
    hi = int(st.curriculum_max_len(cfg, step))
    assert hi == 75
    valid = np.arange(3, hi + 1, 2 if task == "arith" else 1)
    draw = jax.jit(st.sample, static_argnums=(1, 3, 4))
    counts = {}
    for seed in range(300):
        lo, width = st.length_bucket(cfg, step, 32, seed)
        assert (lo, width) in ((1, 32), (33, 64), (65, 96))
        assert st.length_bucket(cfg, step, 32, seed) == (lo, width)  # a function of (seed, step)
        counts[(lo, width)] = counts.get((lo, width), 0) + 1
    # The bucket's frequency is its share of the valid lengths (binomial, 300 draws: 4 sigma).
    for (lo, width), n in counts.items():
        share = np.mean((valid >= lo) & (valid <= width))
        assert abs(n / 300 - share) < 4 * np.sqrt(share * (1 - share) / 300), ((lo, width), n)
    # Inside a bucket the lengths are uniform on its valid lengths up to L_max(step).
    for (lo, width) in counts:
        batch = draw(jax.random.key(lo), cfg, step, width, lo)
        assert batch.inputs.shape == (4096, width - 1)
        lengths = _lengths(batch)
        inside = valid[(valid >= lo) & (valid <= width)]
        assert set(np.unique(lengths)) == set(inside.tolist())
        hist = np.bincount(lengths, minlength=hi + 1)[inside]
        expected = 4096 / len(inside)
        assert np.all(np.abs(hist - expected) < 5 * np.sqrt(expected)), hist
        np.testing.assert_array_equal(np.asarray(batch.mask).sum(axis=1), 1.0)
        assert np.all(np.asarray(batch.targets)[np.arange(4096), lengths - 2] != st.PAD)


def test_length_buckets_bad_input():
    cfg = st.StateTrackDataCfg.paper("parity", batch=8)
    with pytest.raises(ValueError, match="quantum=0: expected an int >= 1"):
        st.length_bucket(cfg, 0, 0, 0)
    with pytest.raises(ValueError, match=r"lo=70: expected None or an int in \[1, width\] = \[1, 64\]"):
        st.sample(jax.random.key(0), cfg, 0, 64, lo=70)
    # One bucket holding every length is the plain sampler, draw for draw.
    for task in ("parity", "arith"):
        cfg = st.StateTrackDataCfg.paper(task, batch=64)
        for step in (0, 5000):
            plain = st.sample(jax.random.key(3), cfg, step)
            whole = st.sample(jax.random.key(3), cfg, step, cfg.max_len, lo=1)
            for x, y in zip(plain, whole):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
