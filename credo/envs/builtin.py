"""Built-in multi-turn environments: CPU-only, no download, a seeded task per id.

``calc``  - tool use: compute an arithmetic expression by calling a calculator tool.
            Actions ``<tool>expression</tool>`` (observation ``= value``) and ``<answer>number</answer>``
            (ends the episode; reward 1 if correct).
``maze``  - grid navigation: reach the goal cell. Action ``<move>up|down|left|right</move>``; observation
            ``at r,c goal r,c`` (``blocked`` when bumping into a wall or the border); reward 1 on the goal.
``wordle``- guess a hidden word from feedback. Action ``<guess>word</guess>``; observation the guess with one
            mark per letter (``G`` right place, ``Y`` elsewhere in the word, ``X`` absent); reward 1 when solved.

Every environment also has an oracle policy (used to write demonstrations for the SFT warm start).
"""
from __future__ import annotations

import ast
import operator
import random
import re
from collections import deque

from credo.envs.base import ActionParser, EnvSpec, StepResult, register_env


def _in_range(env: str, key: str, value: float, lo: float, hi: float) -> None:
    """One-line ValueError unless ``lo <= value <= hi`` (types are checked by ``check_env_params``)."""
    if not lo <= value <= hi:
        raise ValueError(f"environment {env!r}: parameter {key}={value!r} must be in [{lo}, {hi}]")


# ------------------------------------------------------------------------------------------------ calc

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def safe_eval(expr: str) -> int | None:
    """Integer value of an expression of integers, + - * and parentheses; None if anything else."""
    if len(expr) > 80:
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported")

    try:
        return ev(tree.body)
    except (ValueError, RecursionError):
        return None


class CalcEnv:
    def __init__(self, digits: int = 2, terms: int = 3):
        _in_range("calc", "digits", digits, 1, 9)
        _in_range("calc", "terms", terms, 1, 8)  # 9 digits x 8 terms + 7 operators = 79 chars (safe_eval takes 80)
        self.digits, self.terms = digits, terms
        self.expr, self.value, self.tool_results = "", 0, []

    def reset(self, task_id: int) -> str:
        rng = random.Random(f"calc/{self.digits}/{self.terms}/{task_id}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        parts = [str(rng.randint(lo, hi))]
        for _ in range(self.terms - 1):
            parts += [rng.choice("+-*"), str(rng.randint(lo, hi))]
        self.expr = "".join(parts)
        self.value = safe_eval(self.expr)
        self.tool_results = []
        return self.expr

    def step(self, action: str) -> StepResult:
        kind, _, arg = action.partition(":")
        if kind == "tool":
            value = safe_eval(arg)
            if value is None:
                return StepResult("= error", info={"tool_call": True, "tool_error": True})
            self.tool_results.append(value)
            return StepResult(f"= {value}", info={"tool_call": True})
        if kind == "answer":
            ok = arg.strip() == str(self.value)
            return StepResult("correct" if ok else "wrong", reward=float(ok), done=True, info={"success": ok})
        return StepResult("invalid action")

    def close(self) -> None:
        pass


def calc_oracle(env: CalcEnv, observation: str) -> str:
    if env.tool_results:
        return f"<answer>{env.tool_results[-1]}</answer>"
    return f"<tool>{env.expr}</tool>"


register_env(EnvSpec(
    name="calc", factory=CalcEnv, parser=ActionParser(("tool", "answer")), params={"digits": 2, "terms": 3},
    instruction="Compute it. Use <tool>expr</tool>, then <answer>n</answer>.", oracle=calc_oracle))

# ------------------------------------------------------------------------------------------------ maze

_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_MAZE_DRAWS = 1000  # layouts tried per task before the reset fails (an env failure, never an endless loop)


class MazeEnv:
    def __init__(self, size: int = 4, wall_fraction: float = 0.0):
        _in_range("maze", "size", size, 2, 64)
        _in_range("maze", "wall_fraction", wall_fraction, 0.0, 0.5)
        self.size, self.wall_fraction = size, wall_fraction
        self.walls: set[tuple[int, int]] = set()
        self.pos = self.goal = (0, 0)

    def reset(self, task_id: int) -> str:
        rng = random.Random(f"maze/{self.size}/{self.wall_fraction}/{task_id}")
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        for _ in range(_MAZE_DRAWS):
            self.pos, self.goal = rng.sample(cells, 2)
            n_walls = int(self.wall_fraction * len(cells))
            free = [c for c in cells if c not in (self.pos, self.goal)]
            self.walls = set(rng.sample(free, n_walls))
            if self.shortest_path() is not None:
                return self._where()
        raise RuntimeError(f"maze: no solvable layout for task {task_id} in {_MAZE_DRAWS} draws "
                           f"(size={self.size}, wall_fraction={self.wall_fraction})")

    def _where(self) -> str:
        return f"at {self.pos[0]},{self.pos[1]} goal {self.goal[0]},{self.goal[1]}"

    def _free(self, cell: tuple[int, int]) -> bool:
        return 0 <= cell[0] < self.size and 0 <= cell[1] < self.size and cell not in self.walls

    def step(self, action: str) -> StepResult:
        kind, _, arg = action.partition(":")
        if kind != "move" or arg.strip() not in _MOVES:
            return StepResult("invalid action")
        dr, dc = _MOVES[arg.strip()]
        nxt = (self.pos[0] + dr, self.pos[1] + dc)
        if not self._free(nxt):
            return StepResult("blocked " + self._where())
        self.pos = nxt
        if self.pos == self.goal:
            return StepResult("goal reached", reward=1.0, done=True, info={"success": True})
        return StepResult(self._where())

    def shortest_path(self) -> list[str] | None:
        """Moves from the current position to the goal (breadth-first search), or None if unreachable."""
        queue, seen = deque([(self.pos, [])]), {self.pos}
        while queue:
            cell, path = queue.popleft()
            if cell == self.goal:
                return path
            for name, (dr, dc) in _MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if self._free(nxt) and nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, path + [name]))
        return None

    def close(self) -> None:
        pass


def maze_oracle(env: MazeEnv, observation: str) -> str:
    return f"<move>{env.shortest_path()[0]}</move>"


def maze_native(text: str) -> str | None:
    """AgentGym's maze words: ``move down`` (or a bare ``down``) -> ``move:down``."""
    m = re.fullmatch(r"(?:move\s+)?(up|down|left|right)\.?", text.strip().lower())
    return f"move:{m.group(1)}" if m else None


register_env(EnvSpec(
    name="maze", factory=MazeEnv, parser=ActionParser(("move",)), params={"size": 4, "wall_fraction": 0.0},
    instruction="Reach the goal. Use <move>up|down|left|right</move>.", oracle=maze_oracle, native=maze_native))

# ------------------------------------------------------------------------------------------------ wordle

WORDS = ("ace", "ant", "bad", "bat", "bed", "bee", "big", "box", "cab", "can", "cat", "cow", "cub", "dab", "day",
         "den", "dig", "dog", "dot", "ear", "eat", "egg", "fan", "fig", "fox", "gap", "gem", "hat", "hen", "ice",
         "ink", "jam", "jet", "kid", "log", "map", "mix", "net", "nod", "oak", "owl", "pan", "pen", "pig", "rat",
         "red", "sun", "tan", "tea", "ten", "top", "van", "wax", "web", "yak", "zip")


def wordle_marks(guess: str, secret: str) -> str:
    """G right letter right place, Y right letter elsewhere (counting multiplicity), X absent."""
    marks = ["X"] * len(guess)
    remaining = list(secret)
    for i, (g, s) in enumerate(zip(guess, secret)):
        if g == s:
            marks[i] = "G"
            remaining.remove(g)
    for i, g in enumerate(guess):
        if marks[i] == "X" and g in remaining:
            marks[i] = "Y"
            remaining.remove(g)
    return "".join(marks)


class WordleEnv:
    def __init__(self, words: tuple[str, ...] = WORDS):
        self.words = tuple(words)
        self.secret = ""
        self.history: list[tuple[str, str]] = []

    def reset(self, task_id: int) -> str:
        self.secret = random.Random(f"wordle/{task_id}").choice(self.words)
        self.history = []
        return f"guess a {len(self.secret)}-letter word"

    def step(self, action: str) -> StepResult:
        kind, _, guess = action.partition(":")
        guess = guess.strip().lower()
        if kind != "guess" or len(guess) != len(self.secret) or not guess.isalpha():
            return StepResult("invalid guess")
        marks = wordle_marks(guess, self.secret)
        self.history.append((guess, marks))
        if guess == self.secret:
            return StepResult(f"{guess} {marks} solved", reward=1.0, done=True, info={"success": True})
        return StepResult(f"{guess} {marks}")

    def close(self) -> None:
        pass


def wordle_oracle(env: WordleEnv, observation: str) -> str:
    candidates = [w for w in env.words if all(wordle_marks(g, w) == m for g, m in env.history)]
    return f"<guess>{candidates[0]}</guess>"


def wordle_native(text: str) -> str | None:
    """AgentGym's wordle words: space-separated letters (``f r o w n``) or the word -> ``guess:frown``."""
    t = text.strip().lower()
    if re.fullmatch(r"[a-z](?: [a-z])+", t):
        t = t.replace(" ", "")
    return f"guess:{t}" if re.fullmatch(r"[a-z]+", t) else None


register_env(EnvSpec(
    name="wordle", factory=WordleEnv, parser=ActionParser(("guess",)), params={},
    instruction="Find the word. Use <guess>word</guess>.", oracle=wordle_oracle, native=wordle_native))
