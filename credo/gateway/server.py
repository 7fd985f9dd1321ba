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
for a body over the size cap / too slow (credo.http_server's bounds, :attr:`GatewayLimits.server`), 500 with code
``engine_error`` when the engine failed a batch, 503 once the gateway is stopping.

Prompts: the messages rendered with the chat template, an episode's earlier answers' sampled ids substituted where
the agent sends them back (credo.gateway.render); what is recorded and how calls are stitched into trajectories:
credo.gateway.capture.

Generation: one scheduler thread owns the engine (it is not thread-safe): it takes the pending calls (up to
``concurrency``, waiting ``batch_wait_s`` for more once one arrives), groups them by their stop strings and calls
``engine.continue_ids`` once per group. No output is cached: every call samples from the weights the engine serves
at that moment (the trainer updates them between steps), and an episode's remembered ids are dropped when it
closes.
"""
from __future__ import annotations

import asyncio
import collections
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from credo.gateway import protocol as P
from credo.gateway.capture import CallRecord, EpisodeRecord, Segment, stitch
from credo.gateway.contract import AgentClient
from credo.gateway.protocol import GatewayError
from credo.gateway.render import ChatRenderer, TurnMemory, render_choice
from credo.gateway.scheduler import Job, Result, Scheduler, SchedulerStopped
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


class Gateway:
    """The OpenAI-compatible server of one run (module docstring).

    ``engine``: a rollout engine with the token-level API (``continue_ids``: credo.rollout.hf.HFRolloutEngine,
    credo.rollout.vllm_engine.VLLMRolloutEngine). ``sampling``: the run's sampling (its ``max_new_tokens`` caps
    every call). ``tool_parser``: a credo.tools.parsers name. ``chat_template``: a Jinja chat template; None: the
    tokenizer's own, or credo.tools.render.CHAR_TOOL_TEMPLATE when it has none (credo's character models).
    ``token``: an operator key, accepted by ``GET /v1/models`` besides the episodes' keys; it never scopes a
    completion. ``host``: 127.0.0.1 unless told otherwise. ``render``: ``append`` substitutes an episode's sampled
    ids (credo.gateway.render), ``rerender`` renders every request whole, ``auto`` appends when the chat template's
    extension property holds and re-renders when it is refuted (credo.gateway.render.render_choice,
    docs/templates.md).
    """


    def __init__(self, engine: Any, tokenizer: Any, *, sampling: SamplingParams, model_name: str = "credo-policy",
                 host: str = "127.0.0.1", port: int = 0, limits: GatewayLimits = GatewayLimits(),
                 tool_parser: str = "hermes", chat_template: str | None = None, token: str | None = None,
                 render: str = "auto"):
        from credo.tools.parsers import get_parser

        if not hasattr(engine, "continue_ids"):
            raise TypeError(f"the gateway needs an engine with the token-level API (continue_ids); "
                            f"{type(engine).__name__} has none")
        self.engine, self.tokenizer, self.sampling = engine, tokenizer, sampling
        self.model_name, self.host, self.port, self.limits, self.token = model_name, host, port, limits, token
        self.parser = get_parser(tool_parser)
        self.renderer = ChatRenderer(tokenizer, self.parser, chat_template)
        self.append_only, self.verdict = render_choice(self.renderer, render)
        self.eos_id = tokenizer.eos_token_id
        config = getattr(engine, "model_config", None)
        self.max_context = limits.max_context or getattr(config, "max_position_embeddings", None)
        self.vocab_size = len(tokenizer)
        self._episodes: dict[str, _Episode] = {}
        self._closed: collections.OrderedDict[str, str] = collections.OrderedDict()  # key -> episode id
        self._lock = threading.Lock()
        self.scheduler = Scheduler(engine, sampling, concurrency=limits.concurrency,
                                   batch_wait_s=limits.batch_wait_s)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._url: str | None = None

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> str:
        """Serve in a background thread (uvicorn, credo.http_server's bounds) and start the scheduler thread;
        returns the base URL ``http://HOST:PORT/v1``. Idempotent."""
        if self._url is not None:
            if self._server is None:
                raise RuntimeError("this gateway was stopped; a stopped gateway does not start again (build a new one)")
            return self._url
        import uvicorn

        from credo.http_server import fit_fd_limit, install_body_limit, uvicorn_options

        from credo.gateway.app import build_app

        app = build_app(self)
        install_body_limit(app, self.limits.server, flag="GatewayLimits.server.max_body_bytes")
        app.add_middleware(_KeyCheck, gateway=self)  # added last: runs first, before the body is read
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host.strip("[]"), self.port))
        config = uvicorn.Config(app, log_level="warning", lifespan="off",
                                **uvicorn_options(fit_fd_limit(self.limits.server)))
        self._server = uvicorn.Server(config)
        self.scheduler.start()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="credo-gateway-http")
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"the gateway's HTTP server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        port = sock.getsockname()[1]
        host = f"[{self.host.strip('[]')}]" if family == socket.AF_INET6 else self.host
        self._url = f"http://{host}:{port}/v1"
        return self._url

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` (after :meth:`start`)."""
        if self._url is None:
            raise RuntimeError("the gateway is not started (Gateway.start())")
        return self._url

    def stop(self) -> None:
        """Stop the server and the scheduler (calls still waiting are answered 503). Idempotent."""
        self.scheduler.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self._server, self._thread = None, None

    def __enter__(self) -> "Gateway":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ episodes

    def open_episode(self, episode_id: str, *, deadline_s: float | None = None) -> AgentClient:
        """A new episode with a fresh key (``secrets.token_urlsafe(24)``): the returned client's calls are recorded
        in it. ``deadline_s``: seconds from now after which its calls are refused (None: no deadline)."""
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds or None, got {deadline_s!r}")
        key = new_key()
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        with self._lock:
            self._episodes[key] = _Episode(key, str(episode_id), EpisodeRecord(key=key, episode_id=str(episode_id)),
                                           deadline)
        return AgentClient(base_url=self.base_url, api_key=key, model=self.model_name,
                           timeout_s=600.0 if deadline_s is None else float(deadline_s) + 30.0)

    def close_episode(self, client_or_key: AgentClient | str) -> EpisodeRecord:
        """Close the episode: its key is refused from now on (401), a call still generating is answered but not
        recorded (it is listed in ``refused``). Returns its record. Closing twice returns the same record."""
        key = _key_of(client_or_key)
        with self._lock:
            ep = self._episodes.pop(key, None)
            if ep is None:
                if key in self._closed:
                    raise KeyError(f"episode {self._closed[key]!r} is already closed")
                raise KeyError("no episode has this key")
            ep.closed = True
            ep.record.closed = True
            ep.memory = TurnMemory()  # its turns' ids are not needed any more
            self._closed[key] = ep.episode_id
            while len(self._closed) > _CLOSED_KEPT:
                self._closed.popitem(last=False)
            if ep.in_flight:
                ep.record.refused.append(f"episode_closed: {ep.in_flight} call(s) still generating when the episode "
                                         "was closed (answered, not recorded)")
            return ep.record

    def record(self, client_or_key: AgentClient | str) -> EpisodeRecord:
        """The record of an open episode so far."""
        with self._lock:
            ep = self._episodes.get(_key_of(client_or_key))
            if ep is None:
                raise KeyError("no open episode has this key")
            return ep.record

    def open_episodes(self) -> int:
        with self._lock:
            return len(self._episodes)

    # ------------------------------------------------------------------------------------------ calls
    # (on the HTTP server's event loop: the tokenizer is only used there)

    def auth(self, key: str | None, *, completion: bool) -> GatewayError | None:
        """Why ``key`` may not make this request (None: it may)."""
        with self._lock:
            if key and key in self._episodes:
                return None
            if key and key in self._closed:
                return GatewayError(401, f"episode {self._closed[key]!r} is closed: its key is not accepted any more",
                                    type="authentication_error", code="episode_closed")
        if not completion and key and self.token and secrets.compare_digest(key, self.token):
            return None
        return GatewayError(401, "missing or unknown episode key (Authorization: Bearer <the episode's key>)",
                            type="authentication_error", code="invalid_api_key")

    def episode(self, key: str) -> "_Episode":
        with self._lock:
            ep = self._episodes.get(key)
        if ep is None:
            raise self.auth(key, completion=True) or GatewayError(401, "unknown episode key",
                                                                  type="authentication_error")
        return ep

    def refuse(self, key: str | None, error: GatewayError) -> None:
        """Note a refused call in its (open) episode's record."""
        with self._lock:
            ep = self._episodes.get(key or "")
            if ep is not None:
                ep.record.refused.append(error.line())

    def admit(self, ep: "_Episode", prompt_len: int, asked: int | None) -> int:
        """Count the call against its episode's limits; its token cap (what it may generate)."""
        ctx = self.max_context
        if ctx is not None and prompt_len >= ctx:
            raise GatewayError(400, f"the prompt is {prompt_len} tokens; the model's context is {ctx} tokens "
                               "(prompt and completion)", code="context_length_exceeded", param="messages")
        lim = self.limits
        with self._lock:
            if ep.closed:
                raise GatewayError(401, f"episode {ep.episode_id!r} is closed", type="authentication_error",
                                   code="episode_closed")
            if ep.deadline is not None and time.monotonic() > ep.deadline:
                raise GatewayError(400, f"episode {ep.episode_id!r} is past its deadline", code="episode_limit")
            if ep.calls >= lim.max_calls:
                raise GatewayError(400, f"episode {ep.episode_id!r} has made its {lim.max_calls} calls "
                                   "(GatewayLimits.max_calls)", code="episode_limit")
            left = lim.max_tokens - ep.tokens_used - ep.tokens_reserved
            if left <= 0:
                raise GatewayError(400, f"episode {ep.episode_id!r} has used its {lim.max_tokens} completion tokens "
                                   "(GatewayLimits.max_tokens)", code="episode_limit")
            cap = min(self.sampling.max_new_tokens, left, *([asked] if asked else []),
                      *([ctx - prompt_len] if ctx is not None else []))
            ep.calls += 1
            ep.tokens_reserved += cap
            ep.in_flight += 1
            return cap

    async def generate(self, ep: "_Episode", job: Job) -> Result:
        """Run ``job`` on the scheduler; the episode's reservation is settled by :meth:`settle`."""
        try:
            future = self.scheduler.submit(job)
        except SchedulerStopped as exc:
            raise GatewayError(503, str(exc), type="server_error", code="unavailable") from None
        try:
            return await asyncio.wrap_future(future)
        except SchedulerStopped as exc:
            raise GatewayError(503, str(exc), type="server_error", code="unavailable") from None
        except GatewayError:
            raise
        except Exception as exc:  # noqa: BLE001 - the engine failed this batch
            raise GatewayError(500, f"the engine failed: {type(exc).__name__}: {str(exc)[:200]}",
                               type="server_error", code="engine_error") from None

    def settle(self, ep: "_Episode", cap: int, call: CallRecord | None, turn_of: Any = None) -> None:
        """Release a call's reservation; record it (and its turn) unless the episode was closed meanwhile."""
        with self._lock:
            ep.tokens_reserved -= cap
            ep.in_flight -= 1
            if call is None:
                return
            ep.tokens_used += len(call.completion_ids)
            if ep.closed:
                return
            index = len(ep.record.calls)
            ep.record.calls.append(call)
            if turn_of is not None:
                ep.memory.turns.append(turn_of(index))

    def stop_sequences(self, stop: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """The stop strings as token sequences, so the engine stops early where their tokens are sampled (the
        strings are still searched in the decoded text: :meth:`cut_at_stop`)."""
        return tuple(tuple(self.tokenizer(s, add_special_tokens=False)["input_ids"]) for s in stop)

    def decode(self, ids: list[int], ends: tuple[int, ...]) -> str:
        body = ids[:-1] if ids and ids[-1] in ends else ids
        return self.tokenizer.decode(body, skip_special_tokens=True)

    def cut_at_stop(self, result: Result, stop: tuple[str, ...], ends: tuple[int, ...]) -> tuple[Result, str]:
        """(the result cut after the token that completes the first stop string, the text before that string);
        the result and its whole text when no stop string occurs."""
        text = self.decode(result.ids, ends)
        found = [text.find(s) for s in stop if s in text]
        if not found:
            return result, text
        at = min(found)
        lo, hi = 1, len(result.ids)
        while lo < hi:  # the fewest ids whose text holds a stop string
            mid = (lo + hi) // 2
            if any(s in self.decode(result.ids[:mid], ends) for s in stop):
                hi = mid
            else:
                lo = mid + 1
        return Result(result.ids[:lo], result.logprobs[:lo], "stop", result.policy_version), text[:at]

    def stats(self) -> dict[str, int]:
        """The scheduler's counts: engine batches, calls generated, the largest batch."""
        s = self.scheduler
        return {"batches": s.batches, "calls": s.jobs, "largest_batch": s.largest}


_CLOSED_KEPT = 65536  # closed keys remembered (answered "closed" rather than "unknown")


@dataclass
class _Episode:
    key: str
    episode_id: str
    record: EpisodeRecord
    deadline: float | None  # time.monotonic() after which calls are refused
    memory: TurnMemory = field(default_factory=TurnMemory)
    calls: int = 0  # admitted calls
    tokens_used: int = 0  # completion tokens of the answered calls
    tokens_reserved: int = 0  # caps of the calls generating
    in_flight: int = 0
    closed: bool = False


def _key_of(client_or_key: AgentClient | str) -> str:
    return client_or_key.api_key if isinstance(client_or_key, AgentClient) else str(client_or_key)


def new_key() -> str:
    """A fresh episode key."""
    return "ep-" + secrets.token_urlsafe(24)


class _KeyCheck:
    """ASGI middleware: a request under ``/v1/`` without an accepted key is answered 401 before its body is
    read (the completion endpoints accept an open episode's key; ``/v1/models`` also the operator token)."""

    def __init__(self, app: Any, gateway: Gateway):
        self.app, self.gateway = app, gateway

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            key = P.bearer(scope.get("headers", []))
            completion = not scope["path"].startswith("/v1/models")
            error = self.gateway.auth(key, completion=completion)
            if error is not None:
                import json

                body = json.dumps(error.body()).encode()
                await send({"type": "http.response.start", "status": error.status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"www-authenticate", b"Bearer"), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
        await self.app(scope, receive, send)
