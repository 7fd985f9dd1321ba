"""``verify``: AgentV-RL's agentic verification as a multi-turn environment (docs/agentic_verifier.md).

One episode verifies one candidate solution of one problem. The first observation gives the mode, the problem and
the candidate::

    mode: forward            (forward: trace premises -> conclusion; backward: re-check the conclusion
    problem: 12+34=           against its premises)
    candidate: 46

Actions (one per turn; the first complete tag of a turn is taken):

- ``<subtasks>plan</subtasks>``: the plan (sub-claims to check); observation ``plan noted``;
- ``<python>code</python>``: run in credo's sandbox (:func:`credo.rewards.code.shared_sandbox`, Python, tight
  limits); the observation is the verdict and the truncated stdout / stderr, e.g. ``OK: 46``. At most
  ``max_python`` (3) calls per episode, failed ones included; further calls get an error observation. Without
  a working sandbox (no bubblewrap, not root) the observation says so (``error: sandbox unavailable: ...``);
- ``<answer>true|false</answer>``: the verdict; ends the episode.

Reward (:func:`credo.methods.agentic_verifier.reward.outcome_reward`): at the verdict +1 if it matches the candidate's
ground-truth correctness label, -1 if wrong or unparseable, 0 if the label is unknown; with
``require_plan=True`` (the bool-reward variant) -1 when no ``<subtasks>`` turn came before the verdict. Every
other step returns -1, the reward of an episode without a verdict, so an episode cut at the turn cap scores -1
("missing"); a turn without any action tag is an invalid action (reward -1, counted as invalid).

Tasks: task id -> one example of a built-in credo task (``task``, default ``addition``, with ``task_params``),
the candidate is the task's reference answer or, with probability ``corrupt_fraction``, a corrupted copy; the label
is the task's own verifier's judgement of the candidate (so a corruption that happens to be right is labelled
right). ``mode`` is ``forward``, ``backward`` or ``random``: forward with probability ``forward_ratio`` per task id
(the recipe's ``forward_ratio=0.5``, drawn per batch in the reference; per task here, [derived]).

The oracle (SFT warm starts) writes a short plan, one Python check and the right verdict.
"""
from __future__ import annotations

import json
import random
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from credo.envs.base import EVAL_OFFSET, ActionParser, EnvSpec, StepResult, register_env
from credo.envs.client import EnvError, LocalEnvClient
from credo.methods.agentic_verifier.verdict import outcome_reward, parse_verdict

MODES = ("forward", "backward")
NO_VERDICT = -1.0  # reward of a step that is not the verdict: what an episode cut now would score
INSTRUCTION = "Verify the candidate. Plan <subtasks>..</subtasks>, check <python>..</python>, then " \
              "<answer>true|false</answer>."


@dataclass(frozen=True)
class VerifyCase:
    """One verification: the problem, the candidate solution, the mode, and (if known) whether it is correct."""

    problem: str
    candidate: str
    mode: str = "forward"
    label: bool | None = None
    plan: str = ""  # the oracle's plan and check program (generated cases only)
    program: str = ""

    def observation(self) -> str:
        return f"mode: {self.mode}\nproblem: {self.problem}\ncandidate: {self.candidate}"


@dataclass(frozen=True)
class VerifyParser(ActionParser):
    """The tags of :class:`ActionParser`; a text without any becomes the action ``none:`` (so the environment
    sees it and scores it as an episode without a verdict, instead of the client's reward 0)."""

    def parse(self, text: str) -> str | None:
        return super().parse(text) or "none:"


# ------------------------------------------------------------------------------------------------ tasks

def make_case(task_id: int, *, task: str = "addition", task_params: dict | None = None, mode: str = "random",
              forward_ratio: float = 0.5, corrupt_fraction: float = 0.5) -> VerifyCase:
    """The case of ``task_id``, deterministic (one seeded stream per task id and parameters)."""
    from credo.data.tasks import get_task

    params = dict(task_params or {})
    rng = random.Random(f"verify/{task}/{json.dumps(params, sort_keys=True)}/{task_id}")
    t = get_task(task, **params)
    ex = t.make_example(rng, task_id, "eval" if task_id >= EVAL_OFFSET else "train")
    right = t.demonstration(ex)
    candidate = corrupt(right, rng) if rng.random() < corrupt_fraction else right
    if mode == "random":
        mode = "forward" if rng.random() < forward_ratio else "backward"
    label = _label(t, candidate, ex)
    plan, program = oracle_check(task, ex.prompt, candidate, right, mode)
    return VerifyCase(problem=ex.prompt, candidate=candidate, mode=mode, label=label, plan=plan, program=program)


def corrupt(answer: str, rng: random.Random) -> str:
    """A wrong-looking copy of ``answer``: an integer moved by a nonzero offset (kept non-negative when it was),
    else one character replaced (a digit by another digit, a letter by another letter)."""
    s = answer.strip()
    if re.fullmatch(r"-?\d+", s):
        value = int(s)
        for _ in range(20):
            new = value + rng.choice((-10, -2, -1, 1, 2, 10))
            if new >= 0 or value < 0:
                return str(new)
        return str(value + 1)
    if not s:
        return "x"
    i = rng.randrange(len(s))
    c = s[i]
    pool = "0123456789" if c.isdigit() else "abcdefghijklmnopqrstuvwxyz" if c.isalpha() else "xyz"
    return s[:i] + rng.choice([p for p in pool if p != c.lower()]) + s[i + 1:]


def _label(task, candidate: str, example) -> bool:
    from credo.rewards.registry import get_reward_fn, to_result

    fn = get_reward_fn(task.default_reward)
    result = fn([candidate], [example])[0] if getattr(fn, "credo_batch", False) else fn(candidate, example)
    return bool(to_result(result).correct)


def oracle_check(task: str, problem: str, candidate: str, right: str, mode: str) -> tuple[str, str]:
    """(plan, Python program) the oracle writes: forward recomputes the conclusion from the premises, backward
    recovers a premise from the candidate's conclusion. Addition: ``12+34 =? 46`` / ``print(12+34)`` forward,
    ``46-34 =? 12`` / ``print(46-34)`` backward; reversal: reverse the string / un-reverse the candidate; any
    other task: print the reference answer (forward and backward alike)."""
    m = re.fullmatch(r"\s*(\d+)\+(\d+)=\s*", problem) if task == "addition" else None
    if m and re.fullmatch(r"-?\d+", candidate.strip()):
        a, b = m.groups()
        if mode == "forward":
            return f"{a}+{b} =? {candidate}", f"print({a}+{b})"
        return f"{candidate}-{b} =? {a}", f"print({candidate.strip()}-{b})"
    m = re.fullmatch(r"rev (\S+)=", problem) if task == "reversal" else None
    if m:
        if mode == "forward":
            return f"rev {m.group(1)} =? {candidate}", f"print({m.group(1)!r}[::-1])"
        return f"rev {candidate} =? {m.group(1)}", f"print({candidate!r}[::-1])"
    return f"{problem} =? {candidate}", f"print({right!r})"


# ------------------------------------------------------------------------------------------------ sandbox

_SANDBOX_ERRORS: dict[tuple, str] = {}  # (workers, unsafe) -> why the sandbox cannot start here (checked once)
_CACHE: OrderedDict[tuple, tuple[str, dict]] = OrderedDict()
_LOCK = threading.Lock()


def _clip(text: str, n: int, *, tail: bool = False) -> str:
    text = text.strip()
    if len(text) <= n:
        return text
    return "..." + text[-max(n - 3, 0):] if tail else text[:max(n - 3, 0)] + "..."


def run_python(source: str, *, unsafe: bool = False, workers: int | None = None, time_s: float = 1.0,
               memory_mb: int = 128, max_chars: int = 160, cache_size: int = 4096) -> tuple[str, dict[str, Any]]:
    """(observation, info) of one sandboxed Python run: ``VERDICT: stdout`` (stderr's tail after ``|`` when the
    program failed), at most ``max_chars`` characters. Results are memoised per (source, limits) up to
    ``cache_size`` entries (check programs repeat across a group and across the warm start; a program whose output
    is not a function of its source, e.g. random or time, is also replayed)."""
    from credo.rewards.code import shared_sandbox
    from credo.sandbox import Limits, SandboxUnavailable

    key = (source, unsafe, workers, time_s, memory_mb, max_chars)
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        error = _SANDBOX_ERRORS.get((workers, unsafe))
    if error is not None:
        return f"error: sandbox unavailable: {error}", {"tool_call": True, "tool_error": True, "verdict": "SE"}
    try:
        sandbox = shared_sandbox(workers, unsafe)
    except SandboxUnavailable as exc:
        msg = _clip(str(exc), max_chars)
        with _LOCK:
            _SANDBOX_ERRORS[(workers, unsafe)] = msg
        return f"error: sandbox unavailable: {msg}", {"tool_call": True, "tool_error": True, "verdict": "SE"}
    r = sandbox.run(source, "python", limits=Limits(time_s=time_s, memory_mb=memory_mb, output_bytes=16 << 10))
    out = r.stdout.strip()
    if r.verdict == "OK":
        text = f"OK: {_clip(out, max_chars - 4) if out else '(no output)'}"
    else:
        err = r.stderr.strip() or r.detail
        head = f"{r.verdict}: {_clip(out, max_chars // 3)}" if out else f"{r.verdict}:"
        text = _clip(f"{head} | {_clip(err, max_chars, tail=True)}" if err else head, max_chars)
    result = (text, {"tool_call": True, "tool_error": r.verdict != "OK", "verdict": r.verdict})
    if r.verdict != "SE" and cache_size > 0:  # an infrastructure failure is not a property of the program
        with _LOCK:
            _CACHE[key] = result
            while len(_CACHE) > cache_size:
                _CACHE.popitem(last=False)
    return result


# ------------------------------------------------------------------------------------------------ environment

class VerifyEnv:
    def __init__(self, task: str = "addition", task_params: dict | None = None, mode: str = "random",
                 forward_ratio: float = 0.5, corrupt_fraction: float = 0.5, require_plan: bool = False,
                 max_python: int = 3, unsafe: bool = False, workers: int | None = None, time_s: float = 1.0,
                 memory_mb: int = 128, max_output_chars: int = 160, cache_size: int = 4096):
        from credo.data.tasks import get_task

        if mode not in (*MODES, "random"):
            raise ValueError(f"verify: mode must be forward, backward or random, got {mode!r}")
        if not 0.0 <= forward_ratio <= 1.0 or not 0.0 <= corrupt_fraction <= 1.0:
            raise ValueError("verify: forward_ratio and corrupt_fraction must lie in [0, 1]")
        if max_python < 0:
            raise ValueError(f"verify: max_python must be >= 0, got {max_python}")
        get_task(task, **dict(task_params or {}))  # unknown task / parameter: a clear error now
        self.task, self.task_params = task, dict(task_params or {})
        self.mode, self.forward_ratio, self.corrupt_fraction = mode, forward_ratio, corrupt_fraction
        self.require_plan, self.max_python = require_plan, max_python
        self.sandbox_args = {"unsafe": unsafe, "workers": workers, "time_s": time_s, "memory_mb": memory_mb,
                             "max_chars": max_output_chars, "cache_size": cache_size}
        self.case: VerifyCase | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self.planned = False
        self.python_calls = 0
        self.answered = False
        self.verdict: bool | None = None
        self.last_output = ""

    def reset(self, task_id: int) -> str:
        return self.load(make_case(task_id, task=self.task, task_params=self.task_params, mode=self.mode,
                                   forward_ratio=self.forward_ratio, corrupt_fraction=self.corrupt_fraction))

    def load(self, case: VerifyCase) -> str:
        """Start an episode on a given case (the verifier scoring arbitrary pairs, tests)."""
        if case.mode not in MODES:
            raise ValueError(f"verify: a case's mode must be forward or backward, got {case.mode!r}")
        self.case = case
        self._reset_state()
        return case.observation()

    def step(self, action: str) -> StepResult:
        if self.case is None:
            raise RuntimeError("verify: step before reset")
        if self.answered:
            return StepResult("episode over", NO_VERDICT, True, {"invalid_action": True})
        kind, _, arg = action.partition(":")
        if kind == "subtasks":
            self.planned = True
            return StepResult("plan noted", NO_VERDICT)
        if kind == "python":
            if self.python_calls >= self.max_python:
                return StepResult(f"error: no python calls left ({self.max_python} per episode); give <answer>",
                                  NO_VERDICT, info={"tool_error": True})
            self.python_calls += 1
            obs, info = run_python(arg, **self.sandbox_args)
            self.last_output = obs
            return StepResult(obs, NO_VERDICT, info=info)
        if kind == "answer":
            self.answered = True
            self.verdict = parse_verdict(arg)
            plan_ok = self.planned or not self.require_plan
            reward = outcome_reward(arg, self.case.label) if plan_ok else -1.0
            info = {"success": reward > 0, "verdict": self.verdict, "label": self.case.label, "plan": self.planned,
                    "python_calls": self.python_calls, "mode": self.case.mode}
            return StepResult("verdict recorded", reward, True, info)
        return StepResult("invalid action: use <subtasks>, <python> or <answer>", NO_VERDICT,
                          info={"invalid_action": True})

    def close(self) -> None:
        pass


def verify_oracle(env: VerifyEnv, observation: str) -> str:
    """Plan, one Python check, then the right verdict (the label)."""
    case = env.case
    if case is None or case.label is None:
        raise ValueError("verify oracle: the case has no known label")
    if not env.planned:
        return f"<subtasks>{case.plan}</subtasks>"
    if env.python_calls == 0 and env.max_python > 0 and case.program:
        return f"<python>{case.program}</python>"
    return f"<answer>{'true' if case.label else 'false'}</answer>"


VERIFY_PARAMS = {"task": "addition", "task_params": {}, "mode": "random", "forward_ratio": 0.5,
                 "corrupt_fraction": 0.5, "require_plan": False, "max_python": 3, "unsafe": False, "workers": None,
                 "time_s": 1.0, "memory_mb": 128, "max_output_chars": 160, "cache_size": 4096}

register_env(EnvSpec(name="verify", factory=VerifyEnv, parser=VerifyParser(("subtasks", "python", "answer")),
                     params=VERIFY_PARAMS, instruction=INSTRUCTION, oracle=verify_oracle))


class CaseClient(LocalEnvClient):
    """An in-process ``verify`` client whose every reset loads ``case`` (the task id is ignored): the verifier
    scoring arbitrary (problem, candidate) pairs through the same protocol as in training."""

    def __init__(self, case: VerifyCase, **params: Any):
        super().__init__("verify", **params)
        self.case = case

    def reset(self, task_id: int) -> str:
        try:
            return self.env.load(self.case)
        except Exception as exc:
            raise EnvError(f"verify.load failed: {type(exc).__name__}: {exc}") from exc
