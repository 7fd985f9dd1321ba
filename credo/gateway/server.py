"""The gateway: an OpenAI-compatible HTTP server on 127.0.0.1 in front of the policy's rollout engine, recording
every call of every episode token for token (docs/bring-your-own.md).

Use (the ``gateway`` collector does this once per step)::

    gw = Gateway(engine, tokenizer, sampling=SamplingParams.of(cfg.rollout))
    base_url = gw.start()                      # http://127.0.0.1:PORT/v1
    client = gw.open_episode("uid-0", deadline_s=300)   # AgentClient: base_url, a fresh key, the model name
    ... the agent calls client.openai().chat.completions.create(...) ...
    record = gw.close_episode(client)          # EpisodeRecord: the calls, the refused calls
    segments = stitch(record.calls)            # trajectories (credo.gateway.capture)
    gw.stop()

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``. Every request carries
``Authorization: Bearer <episode key>``: the key of an open episode, which scopes the call to that episode (an
unknown or closed key: 401). What is honoured of a request and what is not:

* **sampling**: the run's :class:`~credo.types.SamplingParams` (temperature, top-p, top-k) always rule; an
  agent's ``temperature``, ``top_p``, ``seed``, ``presence_penalty`` ... are accepted and ignored, because the
  recorded log-probs must be the policy's sampler's (on-policy; the trainer recomputes them at the run's
  temperature). ``max_tokens`` / ``max_completion_tokens`` lower the run's ``rollout.max_new_tokens`` for the call,
  never raise it; the episode's token budget (:class:`GatewayLimits`) and the model's context lower it too.
* ``n`` must be 1 (else 400); ``stop`` (a string or up to 4) ends the completion at the first stop string (not
  included in the answer; the sampled ids up to the token that completed it are recorded); ``stream: true``
  answers server-sent events in OpenAI's chunk format ending with ``data: [DONE]`` (the completion is generated
  whole, then sent in chunks: streaming changes the format, not the latency), with a usage chunk when
  ``stream_options.include_usage``; ``logprobs: true`` adds the sampled tokens' log-probs (``top_logprobs`` are
  not served: 0 alternatives).
* **tools**: ``tools`` are rendered with the chat template; ``tool_choice: "none"`` renders no tools;
  ``"auto"``, ``"required"`` and a named function render the tools but do not constrain decoding (the model's
  own output is answered as it is: ``required`` may get a plain answer, a named function another call).
  Generated text is parsed with credo's parser (``tool_parser``, credo.tools.parsers); well-formed calls are
  answered as ``tool_calls`` (``finish_reason: "tool_calls"``), malformed ones stay in the content text.
* ``/v1/completions``: ``prompt`` a string (encoded with the tokenizer's special tokens) or a list of token ids
  (used as they are), or a one-element list of either; ``echo``, ``suffix``, ``best_of`` > 1 are refused (400).

Faults are answered in OpenAI's error format ``{"error": {"message", "type", "code"}}``: 400 for a malformed or
invalid request (never a 500), 401 for a missing / unknown / closed key, 400 with code ``episode_limit`` past the
episode's call or token budget or its deadline (no client retries a 400: a retry could never succeed), 413 / 408
for a body over the size cap / too slow (credo.http_server's bounds, :attr:`GatewayLimits.server`).

Generation: one scheduler thread owns the engine (it is not thread-safe): it takes the pending calls (up to
``concurrency``, waiting ``batch_wait_s`` for more once one arrives), groups them by their stop strings and calls
``engine.continue_ids`` once per group. Nothing is cached across calls or episodes: the trainer updates the
engine's weights between steps and every call samples from the weights served at that moment.
"""
from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from credo.gateway.capture import CallRecord, EpisodeRecord, Segment, stitch
from credo.gateway.contract import AgentClient
from credo.http_server import ServerLimits
from credo.types import SamplingParams

__all__ = ["Gateway", "GatewayLimits", "CallRecord", "EpisodeRecord", "Segment", "stitch", "GatewayError"]


@dataclass(frozen=True)
class GatewayLimits:
    """Per-episode and server limits of a :class:`Gateway`.

    ``max_calls``: answered calls per episode; the next one is refused. ``max_tokens``: completion tokens per
    episode, summed over its calls (prompt tokens are not counted: a long conversation's prompts repeat its
    history); a call's ``max_tokens`` is lowered to what is left, and a call when nothing is left is refused.
    ``concurrency``: calls generating at once (one engine batch at most this large; more wait their turn).
    ``batch_wait_s``: how long the scheduler waits for more calls once one is pending (batching at a small cost
    in latency). ``max_context``: prompt + completion tokens per call (None: the engine model's
    ``max_position_embeddings`` where it has one). ``server``: connection, head and body bounds
    (credo.http_server.ServerLimits).
    """

    max_calls: int = 32
    max_tokens: int = 8192
    concurrency: int = 64
    batch_wait_s: float = 0.005
    max_context: int | None = None
    server: ServerLimits = field(default_factory=ServerLimits)

    def __post_init__(self) -> None:
        for name in ("max_calls", "max_tokens", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GatewayLimits.{name} must be an integer >= 1, got {value!r}")
        if not 0 <= self.batch_wait_s < 10:
            raise ValueError(f"GatewayLimits.batch_wait_s must be in [0, 10) seconds, got {self.batch_wait_s!r}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"GatewayLimits.max_context must be >= 2 or None, got {self.max_context!r}")


class GatewayError(Exception):
    """A refused request: its HTTP status and OpenAI error type / code."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": None}}


class Gateway:
    """The OpenAI-compatible server of one run (module docstring).

    ``engine``: a rollout engine with the token-level API (``continue_ids``: credo.rollout.hf.HFRolloutEngine,
    credo.rollout.vllm_engine.VLLMRolloutEngine). ``sampling``: the run's sampling (its ``max_new_tokens`` caps
    every call). ``tool_parser``: a credo.tools.parsers name. ``chat_template``: a Jinja chat template; None: the
    tokenizer's own, or credo.tools.render.CHAR_TOOL_TEMPLATE when it has none (credo's character models).
    ``token``: an operator key, accepted by ``GET /v1/models`` besides the episodes' keys; it never scopes a
    completion. ``host``: 127.0.0.1 unless told otherwise (a warning without ``token`` elsewhere).
    """

    def __init__(self, engine: Any, tokenizer: Any, *, sampling: SamplingParams, model_name: str = "credo-policy",
                 host: str = "127.0.0.1", port: int = 0, limits: GatewayLimits = GatewayLimits(),
                 tool_parser: str = "hermes", chat_template: str | None = None, token: str | None = None):
        raise NotImplementedError("work in progress (issue 35): the gateway server is being written")

    def start(self) -> str:
        """Serve in a background thread (uvicorn, credo.http_server's bounds) and start the scheduler thread;
        returns the base URL ``http://HOST:PORT/v1``. Idempotent."""
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` (after :meth:`start`)."""
        raise NotImplementedError

    def open_episode(self, episode_id: str, *, deadline_s: float | None = None) -> AgentClient:
        """A new episode with a fresh key (``secrets.token_urlsafe(24)``): the returned client's calls are recorded
        in it. ``deadline_s``: seconds from now after which its calls are refused (None: no deadline)."""
        raise NotImplementedError

    def close_episode(self, client_or_key: AgentClient | str) -> EpisodeRecord:
        """Close the episode: its key is refused from now on (401), a call still generating is answered but not
        recorded (it is listed in ``refused``). Returns its record. Closing twice returns the same record."""
        raise NotImplementedError

    def record(self, client_or_key: AgentClient | str) -> EpisodeRecord:
        """The episode's record so far (open or closed)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server and the scheduler (calls still waiting are answered 503). Idempotent."""
        raise NotImplementedError

    def __enter__(self) -> "Gateway":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def new_key() -> str:
    """A fresh episode key."""
    return "ep-" + secrets.token_urlsafe(24)


_ = threading  # used by the implementation
