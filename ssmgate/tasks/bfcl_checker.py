"""Deterministic checker for BFCL "python simple" (one expected call per example), plus an
out-of-pool hallucination counter, used to score a model's generated tool call.

`parse_call` turns the model's text into one call; `check_call` applies the Berkeley Function Calling
Leaderboard's simple-function rules to it (`ast_checker.simple_function_checker` in `bfcl-eval`):
the right function name, every required parameter, no parameter outside the document, each value of
its documented type and among the acceptable values, strings compared after standardisation, an
omitted parameter allowed only when "" is among its acceptable values.

Where this differs from the official checker (on 16k random valid and mutated calls over the 400
examples the two agreed on all but ~0.1%, all from the points below; the first acceptable value of
every real example passes, see tests/tasks/test_bfcl_checker.py):
- Parsing is strict: keyword arguments whose values are Python literals, one call, bare or as `[call]`.
  The official decoder also strips backticks/quotes, reads a bare name as the string of its name
  (a "variable"), evaluates arithmetic and silently drops positional arguments; all of these are
  malformed here.
- No "variable" fallback: the official type check also accepts a value of the possible answer's type
  when that differs from the documented one. In this data it only matters for simple_python_307
  (`venue: ["", True]` on a string parameter) and simple_python_149 (a nested-list alternative for
  an array of strings); here those values are type errors. "any" takes a value of any type (which
  must still be among the acceptable values).
- Types, int-for-float and string standardisation apply at every nesting depth; the official checker
  accepts an int for a float only at the top level, so `interval=[1, 3]` for an array of floats passes
  here and fails there, and it compares lists inside dicts without standardising their strings.
  A boolean never equals a number here (Python has `True == 1`).
- Function names are compared as written: no "." -> "_" renaming for APIs that forbid dots.
"""
from __future__ import annotations

import ast
import re
from typing import Any, Collection, NamedTuple, Sequence


class Call(NamedTuple):
    name: str      # dotted names kept as written: "math.factorial"
    args: dict     # keyword -> literal value


class CheckResult(NamedTuple):
    correct: bool
    reason: str    # the first failing rule; "" when correct


# ---------------------------------------------------------------- parsing

def _dotted_name(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def parse_call(text: str) -> Call | None:
    """One call `f(a=1)` or `[f(a=1)]` (BFCL's default prompt asks for a list); None when malformed:
    not Python, several calls, positional/`**` arguments, a repeated keyword or a non-literal value."""
    if not isinstance(text, str):
        raise TypeError(f"parse_call expects the model's output as str, got {type(text).__name__}")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):           # ValueError: e.g. a NUL byte in the text
        return None
    if isinstance(node, ast.List):
        if len(node.elts) != 1:
            return None
        node = node.elts[0]
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted_name(node.func)
    if name is None:
        return None
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None or kw.arg in args:    # `**kw`; a repeated keyword parses but never compiles
            return None
        try:
            args[kw.arg] = ast.literal_eval(kw.value)   # literals only: no names, calls or arithmetic
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return Call(name, args)


# ---------------------------------------------------------------- checking

_STRIPPED = re.compile(r"[ ,./\-_*^]")   # the official set: "April 1, 2024" == "april 1 2024"


def standardize(s: str) -> str:
    """The official string normal form: drop spaces and ,./-_*^, lower-case, ' -> "."""
    return _STRIPPED.sub("", s).lower().replace("'", '"')


_SCALARS = {"integer": (int,), "float": (int, float), "string": (str,), "boolean": (bool,)}


def _type_error(value: Any, spec: dict, where: str) -> str | None:
    """Why `value` is not of the documented type `spec` (recursing into items/properties), or None."""
    kind = spec.get("type")
    if kind == "any":
        return None
    if kind in _SCALARS:                       # bool is an int subclass; it is no integer/float here
        ok = isinstance(value, _SCALARS[kind]) and (kind == "boolean" or not isinstance(value, bool))
    elif kind in ("array", "tuple"):           # JSON answers hold tuples as lists, so a tuple param takes both
        ok = isinstance(value, list) or (kind == "tuple" and isinstance(value, tuple))
        if ok and "items" in spec:
            for i, item in enumerate(value):
                if err := _type_error(item, spec["items"], f"{where}[{i}]"):
                    return err
    elif kind == "dict":                       # keys are judged against the answer, values typed here
        ok = isinstance(value, dict)
        props = spec.get("properties", {})
        for key in [k for k in value if k in props] if ok else []:
            if err := _type_error(value[key], props[key], f"{where}[{key!r}]"):
                return err
    else:
        raise ValueError(f"{where}: unknown type {kind!r} in the function document "
                         f"(expected one of {[*_SCALARS, 'array', 'tuple', 'dict', 'any']})")
    return None if ok else f"{where}: expected {kind}, got {type(value).__name__} {value!r}"


def _matches(value: Any, accepted: Any) -> bool:
    """Whether `value` equals the acceptable value `accepted`. A dict in an answer is itself a possible answer
    ({key: [acceptable values]}); lists compare element-wise; strings after standardisation."""
    if isinstance(accepted, dict):
        return (isinstance(value, dict)
                and all(k in accepted and _among(v, accepted[k]) for k, v in value.items())
                and all(k in value or "" in vs for k, vs in accepted.items()))
    if isinstance(accepted, list):
        return (isinstance(value, (list, tuple)) and len(value) == len(accepted)
                and all(_matches(v, a) for v, a in zip(value, accepted)))
    if isinstance(accepted, str):
        return isinstance(value, str) and standardize(value) == standardize(accepted)
    if isinstance(accepted, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(accepted, bool) and value == accepted
    return value == accepted                   # numbers (1 == 1.0) and None


def _among(value: Any, accepted: list) -> bool:
    # An explicit "" also matches "" (as officially): "" marks "may be omitted", not "must be omitted".
    return any(_matches(value, a) for a in accepted)


def _one_function(doc: dict) -> dict:
    """The function document: a bare one, or a BFCL question record holding exactly one."""
    if "function" in doc:
        funcs = doc["function"]
        if len(funcs) != 1:
            raise ValueError(f"{doc.get('id', 'question')}: the simple category has one function per example, "
                             f"got {len(funcs)}")
        doc = funcs[0]
    if "name" not in doc or "properties" not in doc.get("parameters", {}):
        raise ValueError(f"not a function document (needs 'name' and 'parameters.properties'): {sorted(doc)}")
    return doc


def _one_answer(answer: dict) -> tuple[str, dict]:
    """(name, {parameter: [acceptable values]}) from {name: {...}} or a record with 'ground_truth'."""
    where = answer.get("id", "possible answer")
    if "ground_truth" in answer:
        if len(answer["ground_truth"]) != 1:
            raise ValueError(f"{where}: the simple category expects one call in 'ground_truth', "
                             f"got {len(answer['ground_truth'])}")
        answer = answer["ground_truth"][0]
    if len(answer) != 1:
        raise ValueError(f"{where}: expected one function in the possible answer, got {sorted(answer)}")
    (name, params), = answer.items()
    bad = [p for p, vs in params.items() if not isinstance(vs, list)]
    if bad:
        raise ValueError(f"{where}: acceptable values must be lists; not so for {bad}")
    return name, params


def check_call(call: Call | None, function_doc: dict, possible_answer: dict) -> CheckResult:
    """Judge one parsed call (None = malformed) against the example's function and possible answer."""
    doc = _one_function(function_doc)
    name, accepted = _one_answer(possible_answer)
    if doc["name"] != name:
        raise ValueError(f"the function document is {doc['name']!r} but the possible answer calls {name!r}")
    if call is None:
        return CheckResult(False, "malformed")
    if call.name != name:
        return CheckResult(False, f"wrong function name {call.name!r} (expected {name!r})")
    props = doc["parameters"]["properties"]
    for param in doc["parameters"].get("required", []):
        if param not in call.args:
            return CheckResult(False, f"missing required parameter {param!r}")
    for param, value in call.args.items():
        if param not in props or param not in accepted:
            return CheckResult(False, f"unexpected parameter {param!r}")
        if err := _type_error(value, props[param], f"parameter {param!r}"):
            return CheckResult(False, err)
        if not _among(value, accepted[param]):
            shown = [a for a in accepted[param] if a != ""]
            return CheckResult(False, f"parameter {param!r}: value {value!r} not among {shown}")
    for param, values in accepted.items():
        if param not in call.args and "" not in values:
            return CheckResult(False, f"missing parameter {param!r} (the answer does not allow omitting it)")
    return CheckResult(True, "")


def is_hallucination(call: Call | None, pool_names: Collection[str]) -> bool:
    """A well-formed call to a function that was not presented. Malformed output is not one, and
    neither is a wrong but presented function. (A pool lacking the right function makes even the
    correct call count: the counter judges the name against the pool only.)"""
    return call is not None and call.name not in pool_names


_LEADING_NAME = re.compile(r"\s*\[?\s*([A-Za-z_][\w.]*)\s*\(")


def called_name(text: str) -> str | None:
    """The function a possibly malformed output starts to call (`[name(` or `name(`), else None.
    A lenient reading for models too small to finish a valid call: it measures tool choice alone."""
    call = parse_call(text)
    return call.name if call is not None else _leading_name(text)


def _leading_name(text: str) -> str | None:
    m = _LEADING_NAME.match(text)
    return m.group(1) if m else None


def score(outputs: Sequence[str], function_docs: Sequence[dict], possible_answers: Sequence[dict],
          pools: Sequence[Collection[str]]) -> dict:
    """Fractions of outputs that are correct, hallucinated and malformed, over n examples; and, read
    leniently by `called_name`, how often the right function was named (`name_accuracy`) and how
    often a name outside the pool was (`name_out_of_pool`)."""
    n = len(outputs)
    if not n == len(function_docs) == len(possible_answers) == len(pools):
        raise ValueError(f"score needs one function, answer and pool per output; got {n} outputs, "
                         f"{len(function_docs)} functions, {len(possible_answers)} answers, {len(pools)} pools")
    if n == 0:
        raise ValueError("score needs at least one output")
    correct = hallucinated = malformed = right_name = out_of_pool = 0
    for text, doc, answer, pool in zip(outputs, function_docs, possible_answers, pools):
        call = parse_call(text)
        correct += check_call(call, doc, answer).correct
        hallucinated += is_hallucination(call, pool)
        malformed += call is None
        name = call.name if call is not None else _leading_name(text)   # called_name, parsed once
        right_name += name == _one_function(doc)["name"]
        out_of_pool += name is not None and name not in pool
    return {"accuracy": correct / n, "hallucination": hallucinated / n, "malformed": malformed / n,
            "name_accuracy": right_name / n, "name_out_of_pool": out_of_pool / n, "n": n}
