"""The BFCL python-simple checker: parsing, the simple-function rules, the hallucination counter,
aggregation, and agreement with every real possible answer (the data `make venv` installs)."""
import json

import pytest

from ssmgate.tasks import bfcl
from ssmgate.tasks.bfcl_checker import (Call, CheckResult, called_name, check_call, is_hallucination, parse_call,
                                       score)

TRIANGLE = {"name": "calculate_triangle_area", "description": "Area of a triangle.",
            "parameters": {"type": "dict", "required": ["base", "height"], "properties": {
                "base": {"type": "integer", "description": "base"},
                "height": {"type": "integer", "description": "height"},
                "unit": {"type": "string", "description": "unit"}}}}
TRIANGLE_ANSWER = {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}

TYPES = {"name": "geo.lookup", "description": "All the types.",
         "parameters": {"type": "dict", "required": ["city"], "properties": {
             "city": {"type": "string"},
             "radius": {"type": "float"},
             "count": {"type": "integer"},
             "exact": {"type": "boolean"},
             "tags": {"type": "array", "items": {"type": "string"}},
             "point": {"type": "tuple", "items": {"type": "float"}},
             "filters": {"type": "dict", "properties": {"kind": {"type": "string"}, "min": {"type": "integer"}}},
             "rows": {"type": "array", "items": {"type": "dict", "properties": {"k": {"type": "string"}}}},
             "data": {"type": "any"}}}}
TYPES_ANSWER = {"geo.lookup": {
    "city": ["New York", "NY,USA"], "radius": [2.0, ""], "count": [3, ""], "exact": [False, ""],
    "tags": [["Coffee", "Tea"], ""], "point": [[40.7, -74.0], ""],
    "filters": [{"kind": ["Park"], "min": [1, ""]}, ""],
    "rows": [[{"k": ["a"]}, {"k": ["b"]}], ""], "data": ["my_data", ""]}}


def check(text, doc=TYPES, answer=TYPES_ANSWER):
    return check_call(parse_call(text), doc, answer)


# ---------------------------------------------------------------- parse_call

@pytest.mark.parametrize("text, expected", [
    ('calculate_triangle_area(base=10, height=5)', Call("calculate_triangle_area", {"base": 10, "height": 5})),
    ('  [f(a=1, b="x")]\n', Call("f", {"a": 1, "b": "x"})),
    ('math.factorial(number=5)', Call("math.factorial", {"number": 5})),
    ('[a.b.c(x=None, y=True)]', Call("a.b.c", {"x": None, "y": True})),
    ('f(m=[[1, 2], [3]], d={"k": [1.5, "v"], "n": {"z": False}}, t=(1, 2))',
     Call("f", {"m": [[1, 2], [3]], "d": {"k": [1.5, "v"], "n": {"z": False}}, "t": (1, 2)})),
    ('f(lat=-112.07, n=-3)', Call("f", {"lat": -112.07, "n": -3})),
    ('f()', Call("f", {})),
])
def test_parse_call_valid(text, expected):
    assert parse_call(text) == expected


@pytest.mark.parametrize("text", [
    'f(10, height=5)',            # positional argument
    '[f(a=1), g(b=2)]',           # two calls
    'f(a=1); g(b=2)',             # two statements
    'f(a=1',                      # syntax error
    'f(a=b)',                     # non-literal: a variable
    'f(a=g(1))',                  # non-literal: a call
    'f(a=1 + 2)',                 # non-literal: arithmetic
    'f(**kw)', 'f(*xs)', 'f(a=1, a=2)',
    '', '   ', '[]', '42', '"f(a=1)"', 'f.g()(a=1)', 'x = f(a=1)',
])
def test_parse_call_malformed(text):
    assert parse_call(text) is None


def test_parse_call_rejects_non_text():
    with pytest.raises(TypeError, match="str"):
        parse_call(None)


# ---------------------------------------------------------------- check_call

def test_correct_calls():
    assert check('geo.lookup(city="New York")') == CheckResult(True, "")
    assert check_call(parse_call("calculate_triangle_area(base=10, height=5, unit='units')"),
                      TRIANGLE, TRIANGLE_ANSWER) == CheckResult(True, "")
    full = ('geo.lookup(city="new york", radius=2.0, count=3, exact=False, tags=["coffee", "TEA"], '
            'point=(40.7, -74.0), filters={"kind": "park", "min": 1}, rows=[{"k": "a"}, {"k": "B"}], '
            'data="MY_DATA")')
    assert check(full).correct, check(full).reason


def test_malformed_and_wrong_name():
    assert check_call(None, TRIANGLE, TRIANGLE_ANSWER) == CheckResult(False, "malformed")
    assert check('lookup(city="New York")') == CheckResult(False, "wrong function name 'lookup' (expected 'geo.lookup')")


def test_required_and_optional_parameters():
    r = check_call(parse_call("calculate_triangle_area(height=5)"), TRIANGLE, TRIANGLE_ANSWER)
    assert r == CheckResult(False, "missing required parameter 'base'")
    # Optional in the document but the answer has no "": it must be given.
    answer = {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units"]}}
    r = check_call(parse_call("calculate_triangle_area(base=10, height=5)"), TRIANGLE, answer)
    assert not r.correct and "'unit'" in r.reason
    assert check_call(parse_call("calculate_triangle_area(base=10, height=5)"), TRIANGLE, TRIANGLE_ANSWER).correct


def test_unexpected_parameter():
    r = check_call(parse_call("calculate_triangle_area(base=10, height=5, foo=1)"), TRIANGLE, TRIANGLE_ANSWER)
    assert r == CheckResult(False, "unexpected parameter 'foo'")


def test_wrong_values():
    r = check_call(parse_call("calculate_triangle_area(base=11, height=5)"), TRIANGLE, TRIANGLE_ANSWER)
    assert r == CheckResult(False, "parameter 'base': value 11 not among [10]")
    assert not check('geo.lookup(city="Boston")').correct
    assert not check('geo.lookup(city="New York", tags=["Tea", "Coffee"])').correct      # order matters
    assert not check('geo.lookup(city="New York", tags=["Coffee"])').correct             # length matters


def test_types():
    assert check('geo.lookup(city="New York", radius=2)').correct                        # int for float
    r = check('geo.lookup(city="New York", count=3.0)')                                  # float for int
    assert r == CheckResult(False, "parameter 'count': expected integer, got float 3.0")
    assert not check('geo.lookup(city="New York", count=True)').correct                  # bool is no integer
    assert not check('geo.lookup(city="New York", exact=0)').correct                     # nor an int a bool
    assert not check('geo.lookup(city=1)').correct
    assert check('geo.lookup(city="New York", point=[40.7, -74])').correct               # tuple as list, int in float
    r = check('geo.lookup(city="New York", tags=("Coffee", "Tea"))')                     # array needs a list
    assert not r.correct and "expected array" in r.reason
    r = check('geo.lookup(city="New York", tags=["Coffee", 1])')
    assert r == CheckResult(False, "parameter 'tags'[1]: expected string, got int 1")
    r = check('geo.lookup(city="New York", filters={"kind": "Park", "min": "1"})')
    assert not r.correct and "parameter 'filters'['min']: expected integer" in r.reason
    assert check('geo.lookup(city="New York", data="my_data")').correct                  # any: any type...
    answer = {"geo.lookup": {**TYPES_ANSWER["geo.lookup"], "data": [[1, {"k": [True]}], ""]}}
    assert check('geo.lookup(city="New York", data=[1, {"k": True}])', answer=answer).correct
    r = check('geo.lookup(city="New York", data=[1, {"k": 1}])', answer=answer)          # ...but a listed value
    assert not r.correct and "not among" in r.reason                                      # (and True != 1)


def test_string_standardisation():
    for city in ["new york", "NEW YORK", "New-York", "new_york", "NY, USA", "ny.usa", "N.Y. USA"]:
        assert check(f'geo.lookup(city="{city}")').correct, city
    for city in ["New Yrk", "NY;USA", "NY:USA", "New York!"]:
        assert not check(f'geo.lookup(city="{city}")').correct, city
    # Quotes are folded (' -> ") by the official normal form.
    doc = {"name": "say", "parameters": {"type": "dict", "required": ["s"], "properties": {"s": {"type": "string"}}}}
    assert check_call(parse_call('say(s="it\'s")'), doc, {"say": {"s": ['it"s']}}).correct


def test_nested_dict_answer():
    assert check('geo.lookup(city="New York", filters={"kind": "PARK"})').correct     # "min" may be omitted
    assert not check('geo.lookup(city="New York", filters={"min": 1})').correct       # "kind" may not
    assert not check('geo.lookup(city="New York", filters={"kind": "Park", "x": 1})').correct
    assert not check('geo.lookup(city="New York", filters={"kind": "Lake"})').correct
    assert not check('geo.lookup(city="New York", filters=["Park"])').correct


def test_list_of_dicts_answer():
    assert check('geo.lookup(city="New York", rows=[{"k": "a"}, {"k": "b"}])').correct
    assert not check('geo.lookup(city="New York", rows=[{"k": "b"}, {"k": "a"}])').correct
    assert not check('geo.lookup(city="New York", rows=[{"k": "a"}])').correct


def test_bad_inputs_raise():
    call = parse_call("calculate_triangle_area(base=10, height=5)")
    two = {"id": "simple_python_9", "ground_truth": [TRIANGLE_ANSWER, TRIANGLE_ANSWER]}
    with pytest.raises(ValueError, match="simple_python_9.*one call"):
        check_call(call, TRIANGLE, two)
    with pytest.raises(ValueError, match="one function"):
        check_call(call, TRIANGLE, {**TRIANGLE_ANSWER, "other": {}})
    with pytest.raises(ValueError, match="simple_python_9.*one function"):
        check_call(call, {"id": "simple_python_9", "function": [TRIANGLE, TRIANGLE]}, TRIANGLE_ANSWER)
    with pytest.raises(ValueError, match="possible answer calls 'other'"):
        check_call(call, TRIANGLE, {"other": {}})
    with pytest.raises(ValueError, match="must be lists"):
        check_call(call, TRIANGLE, {"calculate_triangle_area": {"base": 10}})
    doc = {"name": "f", "parameters": {"properties": {"a": {"type": "number"}}}}
    with pytest.raises(ValueError, match="unknown type 'number'"):
        check_call(parse_call("f(a=1)"), doc, {"f": {"a": [1]}})


def test_accepts_bfcl_records():
    question = {"id": "simple_python_0", "question": [], "function": [TRIANGLE]}
    record = {"id": "simple_python_0", "ground_truth": [TRIANGLE_ANSWER]}
    assert check_call(parse_call("[calculate_triangle_area(base=10, height=5)]"), question, record).correct


# ---------------------------------------------------------------- hallucination and score

def test_is_hallucination():
    pool = ["calculate_triangle_area", "math.factorial"]
    assert is_hallucination(parse_call("triangle_area(base=10, height=5)"), pool)           # unknown name
    assert not is_hallucination(parse_call("calculate_triangle_area(base=10"), pool)        # malformed
    assert not is_hallucination(parse_call("calculate_triangle_area(base=10, height=5)"), pool)  # correct
    assert not is_hallucination(parse_call("math.factorial(number=5)"), pool)               # in pool, wrong


def test_called_name_reads_unfinished_calls():
    assert called_name("[math.factorial(number=5)]") == "math.factorial"
    assert called_name("  [ get_x (a='unterminated") == "get_x"
    assert called_name("get_x(a=1, 2)") == "get_x"          # malformed but the name is plain
    assert called_name("I would call get_x(") is None and called_name("") is None and called_name("[1(") is None


def test_score():
    pool = {"calculate_triangle_area", "math.factorial"}
    outputs = ["[calculate_triangle_area(base=10, height=5)]",     # correct
               "calculate_triangle_area(base=10, height=6)",       # wrong value
               "area(base=10, height=5)",                          # hallucinated
               "calculate_triangle_area(10, 5)"]                   # malformed
    n = len(outputs)
    got = score(outputs, [TRIANGLE] * n, [TRIANGLE_ANSWER] * n, [pool] * n)
    assert got == {"accuracy": 0.25, "hallucination": 0.25, "malformed": 0.25, "name_accuracy": 0.75,
                   "name_out_of_pool": 0.25, "n": 4}
    lenient = score(["[calculate_triangle_area(base=10, height=", "[area(x=", "hello"], [TRIANGLE] * 3,
                    [TRIANGLE_ANSWER] * 3, [pool] * 3)
    assert lenient["malformed"] == 1.0 and lenient["hallucination"] == 0.0
    assert lenient["name_accuracy"] == pytest.approx(1 / 3) and lenient["name_out_of_pool"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="3 pools"):
        score(outputs, [TRIANGLE] * n, [TRIANGLE_ANSWER] * n, [pool] * 3)
    with pytest.raises(ValueError, match="at least one"):
        score([], [], [], [])


# ---------------------------------------------------------------- the real data

def _first(accepted):
    """A concrete value from an acceptable one: a nested answer dict {key: [values]} becomes a dict of
    the first non-"" value of each key that may not be omitted; lists are made concrete element-wise."""
    if isinstance(accepted, dict):
        return {k: _first(next(v for v in vs if v != "")) for k, vs in accepted.items() if "" not in vs}
    if isinstance(accepted, list):
        return [_first(a) for a in accepted]
    return accepted


def test_first_acceptable_values_pass_on_real_data():
    root = bfcl.data_dir()
    questions, answers = root / bfcl.QUESTIONS, root / bfcl.ANSWERS
    docs = [json.loads(line) for line in questions.read_text().splitlines() if line.strip()]
    gts = [json.loads(line) for line in answers.read_text().splitlines() if line.strip()]
    assert len(docs) == len(gts) == 400
    failures = []
    for doc, gt in zip(docs, gts):
        assert doc["id"] == gt["id"]
        (name, accepted), = gt["ground_truth"][0].items()
        required = doc["function"][0]["parameters"].get("required", [])
        args = {p: _first(next(v for v in vs if v != "")) for p, vs in accepted.items()
                if p in required or "" not in vs}
        call = parse_call(f"[{name}({', '.join(f'{p}={v!r}' for p, v in args.items())})]")   # via the parser too
        assert call == Call(name, args), doc["id"]
        result = check_call(call, doc, gt)
        if not result.correct:
            failures.append((doc["id"], result.reason))
    assert not failures, failures
