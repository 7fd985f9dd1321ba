"""A trained reward model as an RL reward: the batch verifier ``reward_model`` and its HTTP service.

    reward.name=reward_model reward.kwargs={path: RUN/reward_model}            # in-process, batched
    reward.kwargs={url: http://127.0.0.1:8090}                                   # a `credo rm serve` endpoint
    reward.mix=[{name: reward_model, weight: 0.5, kwargs: {path: ...}}]           # mixed with the task verifier

The model is a saved :class:`credo.models.ValueModel` (``credo rm train`` writes ``RUN_DIR/reward_model`` with its
tokenizer); a response's reward is its score under the model's pooling (``credo.rewards.rm_scoring.rm_scores``)
on the example's prompt, raw or squashed (``transform=sigmoid``). ``correct`` is ``score > threshold`` on the raw
score (0 = the model prefers the response to a neutral one); accuracy metrics of a mixed reward come from the task
verifier instead (:mod:`credo.rewards.mixed`).

An unreachable endpoint, a timeout or a malformed reply fails the batch's results (``failed=True``, the runner's
failure score), never the run; so does a reply longer than ``max_reply_bytes`` (default 16 MiB: a score is ~25
bytes of JSON, so ~670,000 scores per batch) or one not complete within ``timeout_s`` of its attempt (a whole-call
deadline, connect to last byte: :mod:`credo.http_client`; with ``retries`` the batch waits at most
``(retries + 1) * timeout_s`` plus the back-off). A score that is NaN, +-inf or not a number (``null`` in a reply)
fails its own result (``error="non-finite score: ..."``, counted as ``reward/nonfinite``).
The service (:func:`create_app`, ``credo rm serve PATH``)::

    POST /score {"prompts": [...], "responses": [...]} -> {"scores": [...]}
    GET  /health                                       -> {"ok": true, "path": ...}

bounded in size and time per request, with an optional bearer token (:mod:`credo.rewards.rm_server`); the client
sends ``reward.kwargs.token`` or ``CREDO_RM_TOKEN``.
"""
from __future__ import annotations

import io
import json
import math
import time
import urllib.error
from pathlib import Path
from typing import Any, Sequence

from credo.http_auth import auth_headers, resolve_token
from credo.http_client import BadReply, HTTPCallError, HTTPStatusError, ReplyTooLarge, request_json
from credo.rewards.registry import register_reward
from credo.rewards.runner import NONFINITE
from credo.rewards.rm_scoring import LocalRewardModel, local_model  # noqa: F401  (re-exported)
from credo.types import Example, RewardResult

MAX_REPLY_BYTES = 16 << 20  # a longer /score reply fails the batch (module docstring)


def score_http(url: str, prompts: Sequence[str], responses: Sequence[str], *, timeout_s: float = 30.0,
               retries: int = 2, token: str | None = None, max_reply_bytes: int | None = None) -> list[float]:
    """Scores from a ``credo rm serve`` endpoint (``POST url/score``). Each attempt must complete (connect to the
    reply's last byte) within ``timeout_s`` and reply at most ``max_reply_bytes`` (None: :data:`MAX_REPLY_BYTES`,
    read at the call); an attempt that could not reach the server, timed out or got a 5xx is retried ``retries``
    times, an oversized or malformed reply is not. An HTTP error status raises ``urllib.error.HTTPError``, an
    unreachable server ``urllib.error.URLError``, every other failure an OSError (:mod:`credo.http_client`).
    ``token`` (default ``CREDO_RM_TOKEN``) is sent as a bearer token."""
    payload = {"prompts": list(prompts), "responses": list(responses)}
    headers = auth_headers(resolve_token("rm", token))
    cap = MAX_REPLY_BYTES if max_reply_bytes is None else max_reply_bytes
    for attempt in range(retries + 1):
        try:
            reply = request_json(url.rstrip("/") + "/score", payload, headers=headers, deadline_s=timeout_s,
                                 max_reply_bytes=cap)
            break
        except HTTPStatusError as exc:  # the server answered: a 4xx will not change on retry
            if exc.status < 500 or attempt == retries:
                raise urllib.error.HTTPError(exc.url, exc.status, exc.reason, None, io.BytesIO(exc.body)) from None
        except (ReplyTooLarge, BadReply):  # the server's reply itself is wrong: the same request gets it again
            raise
        except OSError as exc:  # unreachable (reported as urllib reports it), reset, past the deadline
            if attempt == retries:
                raise exc if isinstance(exc, HTTPCallError) else urllib.error.URLError(exc) from None
        time.sleep(0.2 * 2 ** attempt)
    scores = reply.get("scores") if isinstance(reply, dict) else None  # any other JSON: a failed batch, no crash
    if not isinstance(scores, list) or len(scores) != len(prompts):
        raise ValueError(f"reward model endpoint returned {type(scores).__name__ if scores is not None else 'no scores'}"
                         f" where {len(prompts)} scores were expected")
    return [_number(s) for s in scores]


def _number(value: Any) -> float:
    """A reply's score as a float; NaN for anything that is not a JSON number (null, a string, a bool) or is an
    integer too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


def _sigmoid(x: float) -> float:
    """1 / (1 + e^-x) without overflow for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def _rm_result(s: float, transform: str, threshold: float, seconds: float) -> RewardResult:
    """One response's result; a non-finite model score fails it (the runner gives it the failure score)."""
    if not math.isfinite(s):
        return RewardResult(score=0.0, failed=True, error=f"{NONFINITE}: {s!r} from the reward model",
                            info={"time_s": seconds})
    score = _sigmoid(s) if transform == "sigmoid" else s
    return RewardResult(score=score, correct=s > threshold, info={"rm_score": s, "time_s": seconds})


@register_reward("reward_model", batch=True)
def reward_model(responses: Sequence[str], examples: Sequence[Example], *, path: str | None = None,
                 url: str | None = None, pooling: str = "last", batch_size: int = 64, device: str = "cpu",
                 transform: str = "raw", threshold: float = 0.0, timeout_s: float = 30.0,
                 retries: int = 2, token: str | None = None,
                 max_reply_bytes: int | None = None) -> list[RewardResult]:
    """Scores of a trained reward model (module docstring); exactly one of ``path`` and ``url``."""
    if (path is None) == (url is None):
        raise ValueError("reward_model: give exactly one of path= (a saved reward model) or url= (credo rm serve)")
    if transform not in ("raw", "sigmoid"):
        raise ValueError(f"reward_model: transform must be raw or sigmoid, got {transform!r}")
    prompts = [ex.prompt for ex in examples]
    start = time.perf_counter()
    try:
        raw = score_http(url, prompts, responses, timeout_s=timeout_s, retries=retries, token=token,
                         max_reply_bytes=max_reply_bytes) if url else \
            local_model(path, device, pooling, batch_size).score(prompts, responses)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
        return [RewardResult(score=0.0, failed=True, error=error) for _ in responses]
    each = (time.perf_counter() - start) / max(len(responses), 1)
    return [_rm_result(float(s), transform, threshold, each) for s in raw]


def create_app(path: str | Path, **kwargs: Any):
    """The FastAPI app of ``credo rm serve``, with bounded requests (:func:`credo.rewards.rm_server.create_app`)."""
    from credo.rewards.rm_server import create_app as bounded_app

    return bounded_app(path, **kwargs)


def serve(path: str | Path, *, host: str = "127.0.0.1", port: int = 8090, **kwargs: Any) -> None:
    """``credo rm serve`` (:func:`credo.rewards.rm_server.serve`)."""
    from credo.rewards.rm_server import serve as bounded_serve

    bounded_serve(path, host=host, port=port, **kwargs)
