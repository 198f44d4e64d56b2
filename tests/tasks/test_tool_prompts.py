"""Tool-calling prompts from BFCL's documents: signatures, targets, the held-out split, training
batches reproducible by (seed, step) with the loss on the answer only, and left-padded prompts."""
import numpy as np
import pytest

from ssmgate.tasks import bfcl, tool_pools as tp, tool_prompts as pr


@pytest.fixture(scope="module")
def data():
    examples = bfcl.load_simple_python()
    train, test = pr.split(examples, 20)
    return pr.ToolData(tp.ToolIndex([e.function for e in examples]), train, test, k_max=8, seq_len=1792).validate()


def test_signature_and_target_of_the_first_example(data):
    ex = bfcl.load_simple_python()[0]
    assert pr.signature(ex.function) == "calculate_triangle_area(base:int, height:int, unit?:str)"
    assert pr.answer_args(ex) == {"base": 10, "height": 5}  # unit may be omitted ("" is acceptable)
    assert pr.render_call(ex.name, pr.answer_args(ex)) == "[calculate_triangle_area(base=10, height=5)]"
    assert pr.render_prompt("Q?", [ex.function]) == (
        "Tools:\ncalculate_triangle_area(base:int, height:int, unit?:str)\nQ: Q?\nA: ")


def test_the_split_is_by_function_name_and_stable(data):
    train_names, test_names = {e.name for e in data.train}, {e.name for e in data.test}
    assert not train_names & test_names and len(data.train) + len(data.test) == 400
    assert 0.1 < len(data.test) / 400 < 0.3
    assert pr.split(bfcl.load_simple_python(), 20)[1] == data.test
    with pytest.raises(ValueError, match="test_percent=0"):
        pr.split(data.train, 0)


def test_training_batches_depend_on_seed_and_step_only_and_score_the_answer(data):
    a, b = pr.sft_batch(data, 6, seed=3, step=7), pr.sft_batch(data, 6, seed=3, step=7)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.inputs, pr.sft_batch(data, 6, seed=3, step=8).inputs)
    width = a.inputs.shape[1]
    assert width % data.quantum == 0 and width <= data.seq_len and a.mask.shape == a.inputs.shape
    np.testing.assert_array_equal(a.inputs[:, 1:], a.targets[:, :-1])
    for row, target, mask in zip(a.inputs, a.targets, a.mask):
        text = bytes(int(t) for t in row if t < 256).decode()
        assert text.startswith("Tools:\n") and "\nQ: " in text
        scored = bytes(int(t) for t, m in zip(target, mask) if m and t < 256).decode()
        assert text.endswith("A: " + scored) and scored.startswith("[") and scored.endswith(")]")
        assert target[-1] == pr.BYTES.eos_id and mask[-1] == 1.0 and mask.sum() == len(scored) + 1
        name = scored[1:scored.index("(")]
        assert name in text.split("\nQ: ")[0]  # the main setting always shows the correct tool


def test_a_sequence_length_too_short_for_the_largest_pool_is_refused(data):
    with pytest.raises(ValueError, match=r"seq_len=512: a prompt with 8 tools and its answer can take \d+ bytes"):
        pr.ToolData(data.index, data.train, data.test, k_max=8, seq_len=512).validate()
    with pytest.raises(ValueError, match="k_max=0"):
        pr.ToolData(data.index, data.train, data.test, k_max=0, seq_len=512).validate()


def test_eval_prompts_are_left_padded_to_the_longest(data):
    examples = data.test[:5]
    pools = [tp.main_pool(data.index, e.question, e.name, 4, np.random.default_rng(0)) for e in examples]
    prompts = pr.eval_prompts(data, examples, pools)
    for e, row in zip(examples, prompts):
        text = bytes(int(t) for t in row if t != pr.BYTES.PAD).decode()
        assert text.endswith(f"Q: {e.question}\nA: ") and pr.signature(e.function) in text
    assert (prompts[:, -1] == ord(" ")).all() and (prompts == pr.BYTES.PAD).any()
