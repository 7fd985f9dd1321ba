"""Environment clients: the agent loop talks to every environment through one of these.

A client owns action parsing (the environment receives ``kind:argument`` actions) and normalises the
field names of AgentGym-style servers. Any failure of the environment itself (server error, timeout,
refused connection, malformed answer) raises :class:`EnvError`; the agent loop ends that trajectory
with a recorded failure and zero reward, and the run goes on.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Protocol

from credo.envs.base import ActionParser, StepResult, get_env_spec, make_env


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
            return self.env.reset(task_id)
        except Exception as exc:  # an environment bug is an env failure, not a crash of the run
            raise EnvError(f"{self.name}.reset({task_id}) failed: {type(exc).__name__}: {exc}") from exc

    def step(self, text: str) -> StepResult:
        action = self.parser.parse(text)
        if action is None:
            return _invalid(text)
        try:
            return self.env.step(action)
        except Exception as exc:
            raise EnvError(f"{self.name}.step failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self.env.close()


class HTTPEnvClient:
    """Speaks the AgentGym env-server contract (``/create``, ``/reset``, ``/step``, ``/observation``, ``/close``).

    ``env_name`` selects the action parser and instruction of a registered environment; pass ``parser`` and
    ``instruction`` for a foreign server. Idempotent calls (create, reset, observation, close) are retried
    ``retries`` times; ``step`` is retried only when the request never reached the server (connection
    refused), so an action is never applied twice.
    """

    def __init__(self, base_url: str, env_name: str | None = None, *, timeout_s: float = 30.0, retries: int = 2,
                 backoff_s: float = 0.2, parser: ActionParser | None = None, instruction: str | None = None):
        self.base_url = base_url.rstrip("/")
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
        if obs is None:
            obs = _field(self._call("GET", f"/observation?id={self.env_id}&env_idx={self.env_id}"), "observation",
                         "state", "obs")
        if not isinstance(obs, str):
            raise EnvError(f"{self.name}: reset returned no observation: {str(body)[:200]}")
        return obs

    def step(self, text: str) -> StepResult:
        action = self.parser.parse(text)
        if action is None:
            return _invalid(text)
        body = self._call("POST", "/step", {"id": self.env_id, "env_idx": self.env_id, "action": action},
                          idempotent=False)
        if not isinstance(body, dict):
            raise EnvError(f"{self.name}: step answered {str(body)[:200]!r}")
        obs = _field(body, "observation", "state", "obs")
        reward = _field(body, "reward", "score")
        done = _field(body, "done", "terminated")
        if not isinstance(obs, str) or not isinstance(reward, (int, float)) or not isinstance(done, bool):
            raise EnvError(f"{self.name}: malformed step answer: {str(body)[:200]!r}")
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
        if not isinstance(env_id, int):
            raise EnvError(f"{self.name}: create returned no id: {str(body)[:200]!r}")
        return env_id

    def _call(self, method: str, path: str, payload: dict | None = None, *, idempotent: bool = True) -> Any:
        attempts = 1 + self.retries
        last = ""
        for attempt in range(attempts):
            try:
                return self._request(method, path, payload)
            except _Refused as exc:  # never reached the server: always safe to retry
                last = str(exc)
            except EnvError as exc:
                last = str(exc)
                if not idempotent:
                    break
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * (attempt + 1))
        raise EnvError(f"{self.name}: {method} {path} failed: {last}")

    def _request(self, method: str, path: str, payload: dict | None) -> Any:
        data = json.dumps(payload).encode() if payload is not None and method == "POST" else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise EnvError(f"HTTP {exc.code}: {exc.read()[:200]!r}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                raise _Refused(f"connection refused ({self.base_url})") from None
            raise EnvError(f"{exc.reason}") from None
        except (socket.timeout, TimeoutError):
            raise EnvError(f"timed out after {self.timeout_s:g} s") from None
        except (ConnectionError, OSError) as exc:
            raise EnvError(f"{type(exc).__name__}: {exc}") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except json.JSONDecodeError:
            raise EnvError(f"malformed JSON: {raw[:200]!r}") from None


class _Refused(EnvError):
    pass


def _field(body: Any, *names: str) -> Any:
    if not isinstance(body, dict):
        return None
    for name in names:
        if name in body:
            return body[name]
    return None
