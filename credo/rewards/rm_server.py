"""The HTTP service of ``credo rm serve PATH``, with bounded requests (``docs/security.md``, "Reward model server").

    POST /score {"prompts": [...], "responses": [...]} -> {"scores": [...]}   (+ "truncated": [i, ...] if any)
    GET  /health                                       -> {"ok": true, "path": ...}

Bounds (:class:`ServeLimits`, CLI flags of ``credo rm serve``):

- a body over ``max_request_bytes`` is answered 413 (``Content-Length`` is checked before the body is read, and a
  chunked body is counted while it is read: :class:`credo.http_server.BodyLimit`, which also gives the whole body
  ``body_timeout_s`` to arrive); more than ``max_pairs`` (prompt, response) pairs: 413;
- a prompt + response over ``max_tokens`` tokens (default: the model's context) is cut from the left: the prompt
  loses its beginning first, and a response longer than ``max_tokens - 1`` keeps its last tokens after the
  prompt's last one; the reply lists the indices of the cut pairs in ``truncated``. The last token (``last``
  pooling) is always kept;
- pairs are scored ``batch_size`` sequences per forward, and the model lock (first come, first served) is
  released between forwards, so a small request waits for at most one forward of a big one.

A score that is not finite is sent as ``null`` (the client counts it as a failed result). An optional bearer
token (``--token`` / ``CREDO_RM_TOKEN``, :mod:`credo.http_auth`) guards every route. Connections and request heads
are bounded by :class:`credo.http_server.ServerLimits` (:func:`serve`).
"""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from credo.http_auth import install_bearer_auth, resolve_token, warn_if_exposed
from credo.http_server import ServerLimits, install_body_limit
from credo.http_server import serve as serve_http


@dataclass(frozen=True)
class ServeLimits:
    """Bounds of one ``/score`` request (module docstring)."""

    max_request_bytes: int = 16 * 2**20  # 16 MiB of JSON
    max_pairs: int = 4096  # (prompt, response) pairs per request
    max_tokens: int | None = None  # per prompt + response; None = the model's context (4096 if it names none)
    batch_size: int = 16  # sequences per forward; the lock is released between forwards

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_pairs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"rm serve: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"rm serve: max_tokens must be >= 2 (a prompt token and a response token), "
                             f"got {self.max_tokens}")


class FairLock:
    """A lock granted in the order it was asked for (a plain ``threading.Lock`` lets the thread that releases it
    take it straight back, so a long request could starve the others between its batches)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._issued = 0  # tickets handed out
        self._serving = 0  # the ticket that holds the lock

    def __enter__(self) -> "FairLock":
        with self._cond:
            ticket = self._issued
            self._issued += 1
            self._cond.wait_for(lambda: self._serving == ticket)
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        """Threads holding or waiting for the lock."""
        with self._cond:
            return self._issued - self._serving


def cut_left(prompt_ids: list[int], response_ids: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """The last ``max_tokens`` tokens of prompt + response, with at least one prompt token (module docstring)."""
    if len(prompt_ids) + len(response_ids) <= max_tokens:
        return prompt_ids, response_ids
    response = response_ids[-(max_tokens - 1):]
    return prompt_ids[-(max_tokens - len(response)):], response


def context_length(model: Any) -> int | None:
    """``max_position_embeddings`` of a reward model (a ValueModel's backbone, an implicit model's LM), or None."""
    for part in (model, getattr(model, "backbone", None), getattr(model, "lm", None)):
        n = getattr(getattr(part, "config", None), "max_position_embeddings", None)
        if isinstance(n, int) and n > 0:
            return n
    return None


class BoundedScorer:
    """Scores (prompt, response) pairs of a loaded reward model in bounded batches under a :class:`FairLock`.
    ``on_batch(prompts)`` (tests) is called with each batch's prompts while the lock is held, before the forward."""

    def __init__(self, model: Any, limits: ServeLimits, on_batch: Callable[[list[str]], None] | None = None):
        self.model, self.limits, self.on_batch = model, limits, on_batch
        self.max_tokens = limits.max_tokens or context_length(model.model) or 4096
        self.lock = FairLock()

    def encode(self, prompts: Sequence[str], responses: Sequence[str]):
        """(prompt ids, response ids, indices of the pairs cut to ``max_tokens``), tokenised as the trainer does."""
        from credo.models.tokenizer import encode_prompt, encode_response

        tok, p_ids, r_ids, cut = self.model.tokenizer, [], [], []
        for i, (p, r) in enumerate(zip(prompts, responses)):
            p_full, r_full = encode_prompt(tok, p), encode_response(tok, r)
            p_kept, r_kept = cut_left(p_full, r_full, self.max_tokens)
            if len(p_kept) + len(r_kept) < len(p_full) + len(r_full):
                cut.append(i)
            p_ids.append(p_kept)
            r_ids.append(r_kept)
        return p_ids, r_ids, cut

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> dict[str, Any]:
        """The reply of ``/score``: tokenised outside the lock, one forward of ``batch_size`` rows per lock hold."""
        import torch

        from credo.models.batch import token_batch
        from credo.rewards.rm_scoring import rm_scores

        p_ids, r_ids, cut = self.encode(prompts, responses)
        pad, step, scores = self.model.tokenizer.pad_token_id, self.limits.batch_size, []
        for i in range(0, len(p_ids), step):
            batch = token_batch(p_ids[i : i + step], r_ids[i : i + step], pad_id=pad)
            with self.lock, torch.no_grad():
                if self.on_batch is not None:
                    self.on_batch(list(prompts[i : i + step]))
                scores += rm_scores(self.model.model, batch, self.model.pooling).cpu().tolist()
        reply: dict[str, Any] = {"scores": [s if math.isfinite(s) else None for s in scores]}
        if cut:
            reply["truncated"] = cut
        return reply


class Rejected(Exception):
    """A request answered with ``status`` and ``detail`` before any scoring."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def parse_pairs(raw: bytes, max_pairs: int) -> tuple[list[str], list[str]]:
    """``{prompts: [str], responses: [str]}`` of equal length and at most ``max_pairs``; else 422 / 413."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Rejected(422, "the body is not JSON") from None
    prompts = body.get("prompts") if isinstance(body, dict) else None
    responses = body.get("responses") if isinstance(body, dict) else None
    if not isinstance(prompts, list) or not isinstance(responses, list) \
            or not all(isinstance(s, str) for s in prompts + responses):
        raise Rejected(422, "expected {prompts: [str, ...], responses: [str, ...]}")
    if len(prompts) != len(responses):
        raise Rejected(422, "prompts and responses differ in length")
    if len(prompts) > max_pairs:
        raise Rejected(413, f"{len(prompts)} pairs: at most {max_pairs} per request (--max-pairs)")
    return prompts, responses


def create_app(path: str | Path, *, device: str = "cpu", pooling: str = "last", limits: ServeLimits | None = None,
               token: str | None = None, on_batch: Callable[[list[str]], None] | None = None,
               server_limits: ServerLimits | None = None):
    """The FastAPI app (module docstring); ``app.state.scorer`` is its :class:`BoundedScorer`. Bodies are read
    under ``limits.max_request_bytes`` and ``server_limits.body_timeout_s`` (default :class:`ServerLimits`)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    from credo.rewards.rm_scoring import LocalRewardModel

    limits = limits or ServeLimits()
    model = LocalRewardModel(path, device=device, pooling=pooling, batch_size=limits.batch_size)
    scorer = BoundedScorer(model, limits, on_batch)
    app = FastAPI(title="credo reward model")
    app.state.scorer = scorer
    install_body_limit(app, replace(server_limits or ServerLimits(), max_body_bytes=limits.max_request_bytes),
                       flag="--max-request-bytes")
    install_bearer_auth(app, token)

    async def score(request):  # a Starlette route: the raw body (already bounded by the body limit)
        try:
            prompts, responses = parse_pairs(await request.body(), limits.max_pairs)
        except Rejected as exc:
            return JSONResponse({"detail": exc.detail}, status_code=exc.status)
        return JSONResponse(await run_in_threadpool(scorer.score, prompts, responses))

    app.add_route("/score", score, methods=["POST"])

    @app.get("/health")
    def health() -> dict:
        return {"ok": True, "path": model.path}

    return app


def serve(path: str | Path, *, host: str = "127.0.0.1", port: int = 8090, token: str | None = None,
          server_limits: ServerLimits | None = None, **kwargs: Any) -> None:
    """``credo rm serve``: the app of :func:`create_app` under uvicorn, its connections and heads bounded by
    ``server_limits`` (:mod:`credo.http_server`); the token defaults to ``CREDO_RM_TOKEN``."""
    server_limits = server_limits or ServerLimits()
    token = resolve_token("rm", token)
    warn_if_exposed(host, token, what="credo rm serve")
    app = create_app(path, token=token, server_limits=server_limits, **kwargs)
    serve_http(app, host=host, port=port, limits=server_limits)
