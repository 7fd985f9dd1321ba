"""Generated tasks: determinism, held-out eval, correct answers, and parameter validation."""
from __future__ import annotations

import ast
import random
import string
from collections import Counter
from fractions import Fraction

import pytest

from credo.data import build_splits, get_task, list_tasks, task_param_names
from credo.data.tasks import CountdownTask, Task

PRINTABLE = set(string.printable) - set("\t\n\r\x0b\x0c")


# ------------------------------------------------------------------ independent Countdown checker


def _eval_node(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp):
        left, right = _eval_node(node.left, used), _eval_node(node.right, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            return left / right  # ZeroDivisionError fails the test
    raise AssertionError(f"disallowed syntax: {ast.dump(node)}")


def countdown_ok(expr: str, numbers: list[int], target: int) -> bool:
    used: list[int] = []
    value = _eval_node(ast.parse(expr, mode="eval").body, used)
    return Counter(used) == Counter(numbers) and value == target


def test_checker_rejects_wrong_answers():
    assert countdown_ok("(3+5)*2", [3, 5, 2], 16)
    assert not countdown_ok("3+5*2", [3, 5, 2], 16)  # wrong value
    assert not countdown_ok("(3+5)*2*2", [3, 5, 2], 32)  # number used twice
    assert not countdown_ok("3+5", [3, 5, 2], 8)  # number unused


# ------------------------------------------------------------------ registry


def test_registry_lists_builtins():
    assert {"reversal", "addition", "countdown"} <= set(list_tasks())
    assert get_task("countdown").default_reward == "countdown"
    assert get_task("reversal").default_reward == "exact_match"
    assert get_task("addition").default_reward == "exact_match"
    assert task_param_names("reversal") == {"alphabet_size": 8, "min_len": 3, "max_len": 6}
    assert task_param_names("addition")["digits"] == 2
    assert {"num_count", "max_number", "max_target"} <= set(task_param_names("countdown"))


def test_unknown_task_suggests():
    with pytest.raises(KeyError) as err:
        get_task("reversl")
    msg = str(err.value)
    assert "'reversal'" in msg and "did you mean" in msg and "addition" in msg


def test_unknown_param_named():
    with pytest.raises(TypeError, match="alphabet_sise.*did you mean 'alphabet_size'"):
        get_task("reversal", alphabet_sise=4)


@pytest.mark.parametrize(
    "name, params, exc",
    [
        ("reversal", {"min_len": 5, "max_len": 3}, ValueError),
        ("reversal", {"alphabet_size": 27}, ValueError),
        ("reversal", {"min_len": "3"}, TypeError),
        ("addition", {"digits": 0}, ValueError),
        ("countdown", {"num_count": 0}, ValueError),
        ("countdown", {"max_target": True}, TypeError),
    ],
)
def test_bad_param_values(name, params, exc):
    with pytest.raises(exc):
        get_task(name, **params)


# ------------------------------------------------------------------ splits


@pytest.mark.parametrize("name", ["reversal", "addition", "countdown"])
def test_deterministic_by_seed(name):
    task = get_task(name)
    a = build_splits(task, train_size=200, eval_size=50, seed=3)
    b = build_splits(get_task(name), train_size=200, eval_size=50, seed=3)
    c = build_splits(task, train_size=200, eval_size=50, seed=4)
    assert a == b
    assert [e.prompt for e in a[0]] != [e.prompt for e in c[0]]
    assert [e.prompt for e in a[1]] != [e.prompt for e in c[1]]


@pytest.mark.parametrize("name", ["reversal", "addition", "countdown"])
def test_eval_held_out_and_distinct(name):
    train, evals = build_splits(get_task(name), train_size=2000, eval_size=200, seed=0)
    assert len(train) == 2000 and len(evals) == 200
    eval_prompts = [e.prompt for e in evals]
    assert len(set(eval_prompts)) == len(eval_prompts)
    assert not set(eval_prompts) & {e.prompt for e in train}
    assert train[17].uid == f"{name}/train/17"
    assert evals[3].uid == f"{name}/eval/3"
    assert len({e.uid for e in train + evals}) == len(train) + len(evals)


def test_held_out_in_small_space():
    # 2 letters, length 3: 8 possible prompts; eval takes 6 distinct, train must use the other 2.
    task = get_task("reversal", alphabet_size=2, min_len=3, max_len=3)
    train, evals = build_splits(task, train_size=50, eval_size=6, seed=1)
    assert len({e.prompt for e in evals}) == 6
    assert len({e.prompt for e in train}) == 2
    assert not {e.prompt for e in evals} & {e.prompt for e in train}


def test_too_small_space_raises():
    task = get_task("reversal", alphabet_size=2, min_len=3, max_len=3)
    with pytest.raises(ValueError, match="too small"):
        build_splits(task, train_size=10, eval_size=9, seed=0)  # only 8 distinct prompts
    with pytest.raises(ValueError, match="too small"):
        build_splits(task, train_size=10, eval_size=8, seed=0)  # nothing left for train


def test_zero_sizes_and_bad_sizes():
    assert build_splits(get_task("addition"), train_size=0, eval_size=0, seed=0) == ([], [])
    with pytest.raises(ValueError):
        build_splits(get_task("addition"), train_size=-1, eval_size=0, seed=0)


# ------------------------------------------------------------------ answers


def test_reversal_answers():
    task = get_task("reversal", alphabet_size=5, min_len=2, max_len=7)
    train, evals = build_splits(task, train_size=500, eval_size=100, seed=0)
    lengths = set()
    for ex in train + evals:
        assert ex.prompt.startswith("rev ") and ex.prompt.endswith("=")
        s = ex.prompt[4:-1]
        lengths.add(len(s))
        assert set(s) <= set("abcde")
        assert ex.answer == s[::-1]
        assert task.demonstration(ex) == ex.answer
    assert lengths == set(range(2, 8))


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_addition_answers(digits):
    task = get_task("addition", digits=digits)
    train, evals = build_splits(task, train_size=300, eval_size=50, seed=0)
    for ex in train + evals:
        a, b = ex.prompt[:-1].split("+")
        assert len(a) == digits and len(b) == digits
        assert ex.answer == str(int(a) + int(b))
        assert task.demonstration(ex) == ex.answer


@pytest.mark.parametrize("params", [{}, {"num_count": 4, "max_number": 12, "max_target": 200}, {"num_count": 2}])
def test_countdown_answers_valid(params):
    task = get_task("countdown", **params)
    train, evals = build_splits(task, train_size=1000, eval_size=100, seed=0)
    ops = Counter()
    for ex in train + evals:
        numbers, target = ex.meta["numbers"], ex.meta["target"]
        assert ex.prompt == f"{' '.join(map(str, numbers))} to {target}:"
        assert len(numbers) == task.num_count
        assert all(1 <= n <= task.max_number for n in numbers)
        assert isinstance(target, int) and 1 <= target <= task.max_target
        demo = task.demonstration(ex)
        assert countdown_ok(demo, numbers, target), (ex, demo)
        ops.update(c for c in demo if c in "+-*/")
    assert set(ops) == set("+-*/")  # every operator shows up


def test_countdown_impossible_target_raises():
    task = CountdownTask(num_count=1, max_number=9, max_target=1, max_tries=1)
    rng = random.Random(0)
    with pytest.raises(ValueError, match="no positive integer target"):
        for i in range(100):
            task.make_example(rng, i, "train")


@pytest.mark.parametrize("name", ["reversal", "addition", "countdown"])
def test_printable_ascii(name):
    task = get_task(name)
    train, evals = build_splits(task, train_size=300, eval_size=50, seed=0)
    for ex in train + evals:
        assert set(ex.prompt) <= PRINTABLE
        assert set(task.demonstration(ex)) <= PRINTABLE
        assert len(ex.prompt) <= 24


def test_base_task_is_abstract():
    with pytest.raises(NotImplementedError):
        Task().make_example(random.Random(0), 0, "train")
