"""protocol §9 C15 (the BFCL harness without a language model): the data of bfcl-eval, BM25 rankings,
the main setting's injection rule and the weak retriever's recall."""
import numpy as np
import pytest
from scipy import stats

from ssmgate.tasks import bfcl, tool_pools as tp


@pytest.fixture(scope="module")
def data():
    examples = bfcl.load_simple_python()
    return examples, tp.ToolIndex([e.function for e in examples])


def test_the_400_examples_load_with_their_answers(data):
    examples, index = data
    assert len(examples) == 400 and len({e.id for e in examples}) == 400
    assert all(set(e.answer) == {e.name} for e in examples)
    assert len(index) == len({e.name for e in examples}) == 370  # the shared pool, deduplicated by name
    assert examples[0].name == "calculate_triangle_area" and examples[0].answer[examples[0].name]["base"] == [10]


def test_missing_or_bad_data_names_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="BFCL_v4_simple_python.json"):
        bfcl.load_simple_python(tmp_path)
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / bfcl.QUESTIONS).write_text('{"id": "a", "question": [], "function": []}\n')
    (tmp_path / bfcl.ANSWERS).write_text('{"id": "a", "ground_truth": []}\n')
    with pytest.raises(ValueError, match="1 questions and 1 answers; expected 400"):
        bfcl.load_simple_python(tmp_path)


def test_bm25_rankings_are_deterministic_and_ties_keep_pool_order(data):
    examples, index = data
    again = tp.ToolIndex([e.function for e in examples])
    for e in examples[::37]:
        np.testing.assert_array_equal(index.ranking(e.question), again.ranking(e.question))
    twins = tp.ToolIndex([{"name": f"tool_{i}", "description": "same words"} for i in range(5)])
    assert twins.ranking("same words").tolist() == [0, 1, 2, 3, 4]
    assert twins.ranking("nothing matches").tolist() == [0, 1, 2, 3, 4]
    # the query's words pull their tool to the top
    assert index.names[index.ranking(examples[0].question)[0]] == "calculate_triangle_area"


@pytest.mark.parametrize("k", [1, 4, 8, 24])
def test_the_correct_tool_is_in_every_main_pool_by_the_injection_rule(data, k):
    examples, index = data
    rng = np.random.default_rng(k)
    injected = 0
    for e in examples:
        pool = tp.main_pool(index, e.question, e.name, k, rng)
        top = [index.names[i] for i in index.ranking(e.question)[:k]]
        assert len(pool) == k == len(set(pool)) and e.name in pool
        if e.name in top:
            assert pool == top  # BM25's own order, best first
        else:
            injected += 1
            assert [n for n in pool if n != e.name] == top[:k - 1]  # the k-th dropped, order kept
    assert injected == round(400 * (1 - tp.bm25_recall(index, [e.question for e in examples],
                                                         [e.name for e in examples], k)))


def test_an_injected_tool_lands_at_a_uniform_position(data):
    examples, index = data
    missed = next(e for e in examples if index.check(e.name) not in index.ranking(e.question)[:8])
    rng = np.random.default_rng(0)
    positions = [tp.main_pool(index, missed.question, missed.name, 8, rng).index(missed.name) for _ in range(4000)]
    assert stats.chisquare(np.bincount(positions, minlength=8)).pvalue > 0.001


def test_weak_recall_is_k_over_n_when_beta_times_the_spread_is_small(data):
    examples, index = data
    queries, names = [e.question for e in examples[:60]], [e.name for e in examples[:60]]
    spread = max(np.ptp(index.scores(q)) for q in queries)
    beta = 0.05 / spread  # beta * spread = 0.05: scores barely tilt the ranking
    for k in (8, 24, 72):
        assert tp.weak_recall(index, queries, names, k, beta, samples=20) == pytest.approx(k / len(index), abs=0.05)
    for k in (8, 72):  # beta = 0 is exactly uniform
        assert tp.weak_recall(index, queries, names, k, 0.0, samples=20) == pytest.approx(k / len(index), abs=0.03)


def test_weak_recall_grows_with_k_and_beta(data):
    examples, index = data
    queries, names = [e.question for e in examples[:50]], [e.name for e in examples[:50]]
    table = {beta: [tp.weak_recall(index, queries, names, k, beta, samples=10, seed=1) for k in (1, 8, 24, 72)]
             for beta in (0.05, 1.0, 10.0)}
    for row in table.values():
        assert row == sorted(row)
    for i in range(4):
        assert table[0.05][i] <= table[1.0][i] <= table[10.0][i]
    assert table[10.0][2] > 0.9 and table[0.05][2] < 0.25


def test_bad_arguments_are_named(data):
    _, index = data
    with pytest.raises(ValueError, match=r"k=0: expected a pool size in \[1, 370\]"):
        tp.main_pool(index, "q", index.names[0], 0, np.random.default_rng(0))
    with pytest.raises(KeyError, match="'no_such_tool' is not in the shared pool"):
        tp.main_pool(index, "q", "no_such_tool", 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="beta=-1.0"):
        tp.weak_pool(index, "q", 4, -1.0, np.random.default_rng(0))
