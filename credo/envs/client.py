"""Environment clients: the agent loop talks to every environment through one of these.

A client owns action parsing (the environment receives ``kind:argument`` actions) and normalises the
field names of AgentGym-style servers. Any failure of the environment itself (server error, timeout,
refused or reset connection, truncated body, garbage status line, malformed, oversized or too deeply nested
answer, non-finite reward, a call not complete within ``timeout_s``) raises :class:`EnvError`; the agent loop
ends that trajectory as a recorded env failure, which the trainer leaves out of the update
(``credo.collect.agent.drop_env_failures``), and the run goes on.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, Protocol

from credo.envs.base import ActionParser, StepResult, get_env_spec, make_env
from credo.http_auth import auth_headers
from credo.http_client import DeadlineExceeded, HTTPStatusError, ReplyTooLarge, request

MAX_REPLY_BYTES = 8 << 20  # a longer answer is an env failure (8 MiB: observations are short texts)


class EnvError(RuntimeError):
    """The environment failed (not the agent): the trajectory ends as a recorded env failure."""


class EnvClient(Protocol):
    name: str
    instruction: str

    def reset(self, task_id: int) -> str: ...

    def step(self, text: str) -> StepResult: ...

    def close(self) -> None: ...


def _invalid(text: str) -> StepResult:
    return StepResult("invalid action", 0.0, False, {"invalid_action": True})


class LocalEnvClient:
    """An in-process environment instance."""

    def __init__(self, name: str, **params: Any):
        spec = get_env_spec(name)
        self.name, self.instruction, self.parser = name, spec.instruction, spec.parser
        self.env = make_env(name, **params)

    def reset(self, task_id: int) -> str:
        try:
            obs = self.env.reset(task_id)
        except Exception as exc:  # an environment bug is an env failure, not a crash of the run
            raise EnvError(f"{self.name}.reset({task_id}) failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(getattr(self.env, "instruction", None), str):  # a per-task one (skyrl_gym: a row's system)
            self.instruction = self.env.instruction
        return obs

    def step(self, text: str) -> StepResult:
        action = self.parser.parse(text)
        if action is None:
            return _invalid(text)
        try:
            return self.env.step(action)
        except Exception as exc:
            raise EnvError(f"{self.name}.step failed: {type(exc).__name__}: {exc}") from exc

    def tool_schemas(self) -> list[dict]:
        """The tools of a structured-tools environment (``EnvSpec.tools``) for the task it was reset on."""
        if not hasattr(self.env, "tool_schemas"):
            raise EnvError(f"{self.name} is not a structured-tools environment (no tool_schemas)")
        return self.env.tool_schemas()

    def close(self) -> None:
        self.env.close()


class HTTPEnvClient:
    """Speaks the AgentGym env-server contract (``/create``, ``/reset``, ``/step``, ``/observation``, ``/close``).

    ``env_name`` selects the action parser and instruction of a registered environment; pass ``parser`` and
    ``instruction`` for a foreign server. Idempotent calls (create, reset, observation, close) are retried
    ``retries`` times; ``step`` is retried only when the request never reached the server (connection
    refused), so an action is never applied twice. ``token`` is sent as ``Authorization: Bearer`` (the server's
    ``--token`` / ``CREDO_ENV_TOKEN``). Each HTTP call must complete, connect to the answer's last byte, within
    ``timeout_s`` (``rollout.collector.timeout_s``) and answer at most ``max_reply_bytes``
    (:mod:`credo.http_client`).
    """

    def __init__(self, base_url: str, env_name: str | None = None, *, timeout_s: float = 30.0, retries: int = 2,
                 backoff_s: float = 0.2, parser: ActionParser | None = None, instruction: str | None = None,
                 token: str | None = None, max_reply_bytes: int = MAX_REPLY_BYTES):
        self.base_url = base_url.rstrip("/")
        self.token, self.max_reply_bytes = token, max_reply_bytes
        spec = get_env_spec(env_name) if env_name else None
        self.name = env_name or base_url
        self.parser = parser or (spec.parser if spec else None)
        if self.parser is None:
            raise ValueError("HTTPEnvClient needs env_name of a registered environment or an explicit parser")
        self.instruction = instruction if instruction is not None else (spec.instruction if spec else "")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.env_id: int | None = None

    # ------------------------------------------------------------------------ protocol
    def reset(self, task_id: int) -> str:
        if self.env_id is None:
            self.env_id = self._create()
        body = self._call("POST", "/reset", {"id": self.env_id, "env_idx": self.env_id, "data_idx": task_id})
        obs = _field(body, "observation", "state", "obs")
        if obs is None:  # a bare string (AgentGym servers) or an object with the text
            got = self._call("GET", f"/observation?id={self.env_id}&env_idx={self.env_id}")
            obs = got if isinstance(got, str) else _field(got, "observation", "state", "obs")
        if not isinstance(obs, str):
            raise EnvError(f"{self.name}: reset returned no observation: {_short(body)}")
        if isinstance(body, dict) and isinstance(body.get("instruction"), str):  # a per-task one (credo's server)
            self.instruction = body["instruction"]
        return obs

    def step(self, text: str) -> StepResult:
        action = self.parser.parse(text)
        if action is None:
            return _invalid(text)
        body = self._call("POST", "/step", {"id": self.env_id, "env_idx": self.env_id, "action": action},
                          idempotent=False)
        if not isinstance(body, dict):
            raise EnvError(f"{self.name}: step answered {_short(body)}")
        obs = _field(body, "observation", "state", "obs")
        reward = _field(body, "reward", "score")
        done = _field(body, "done", "terminated")
        if not isinstance(obs, str) or not _is_number(reward) or not isinstance(done, bool):
            raise EnvError(f"{self.name}: malformed step answer: {_short(body)}")
        info = body.get("info") if isinstance(body.get("info"), dict) else {}
        return StepResult(obs, float(reward), done, info)

    def close(self) -> None:
        if self.env_id is not None:
            try:
                self._call("POST", "/close", {"id": self.env_id, "env_idx": self.env_id})
            except EnvError:
                pass
            self.env_id = None

    # ------------------------------------------------------------------------ HTTP
    def _create(self) -> int:
        body = self._call("POST", "/create", {})
        env_id = body if isinstance(body, int) else _field(body, "id", "env_idx") if isinstance(body, dict) else None
        if not isinstance(env_id, int) or isinstance(env_id, bool):
            raise EnvError(f"{self.name}: create returned no id: {_short(body)}")
        return env_id

    def _call(self, method: str, path: str, payload: dict | None = None, *, idempotent: bool = True) -> Any:
        attempts = 1 + self.retries
        last = ""
        for attempt in range(attempts):
            try:
                return self._request(method, path, payload)
            except _Refused as exc:  # never reached the server: always safe to retry
                last = str(exc)
            except _Rejected as exc:  # the server refused the request itself (4xx): the same request fails again
                last = str(exc)
                break
            except EnvError as exc:
                last = str(exc)
                if not idempotent:
                    break
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * (attempt + 1))
        raise EnvError(f"{self.name}: {method} {path} failed: {last}")

    def _request(self, method: str, path: str, payload: dict | None) -> Any:
        """One HTTP exchange, decoded; every transport or decoding failure raises EnvError (_Refused when the
        request never reached the server, _Rejected for a 4xx other than 408 / 429)."""
        data = json.dumps(payload).encode() if payload is not None and method == "POST" else None
        try:
            raw = request(self.base_url + path, method=method, body=data, deadline_s=self.timeout_s,
                          headers={"Content-Type": "application/json", **auth_headers(self.token)},
                          max_reply_bytes=self.max_reply_bytes).body
        except HTTPStatusError as exc:
            cls = _Rejected if 400 <= exc.status < 500 and exc.status not in (408, 429) else EnvError
            raise cls(f"HTTP {exc.status}: {exc.body[:200]!r}") from None
        except ConnectionRefusedError:
            raise _Refused(f"connection refused ({self.base_url})") from None
        except DeadlineExceeded:
            raise EnvError(f"timed out after {self.timeout_s:g} s (whole-call deadline)") from None
        except ReplyTooLarge:
            raise EnvError(f"answer longer than {self.max_reply_bytes} bytes") from None
        except (OSError, ValueError) as exc:  # resets, truncated bodies, garbage status lines (BadReply)
            raise EnvError(f"{type(exc).__name__}: {_one_line(str(exc))}") from None
        return _decode(raw)


def _decode(raw: bytes) -> Any:
    """The JSON value of a reply body (None when empty); malformed, undecodable or too deeply nested -> EnvError."""
    try:
        return json.loads(raw) if raw.strip() else None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise EnvError(f"malformed JSON ({type(exc).__name__}): {raw[:200]!r}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(body: Any) -> str:
    """At most 200 characters of a decoded answer, for error messages (safe on any nesting depth)."""
    try:
        return repr(body)[:200]
    except RecursionError:
        return f"<{type(body).__name__} nested too deeply>"


class _Refused(EnvError):
    pass


class _Rejected(EnvError):
    """A 4xx answer other than 408 / 429: not retried (a server without /close answers 404 every time)."""


def _field(body: Any, *names: str) -> Any:
    if not isinstance(body, dict):
        return None
    for name in names:
        if name in body:
            return body[name]
    return None
