"""AgentGym environment servers as credo environments: a table of their HTTP contracts, and the client that speaks them.

AgentGym (``agentenv-*`` in the AgentGym repository) runs every environment as a FastAPI server; its clients
(``agentenv/envs/*.py``) differ per environment in how an instance is addressed (``id`` or ``env_idx``), how a
task is picked at reset (``data_idx``, ``game``, ``seed``, ``session_id``, ``item_id``), which route prefix the
server uses (LMRL-Gym serves maze under ``/maze``), how the action is cut out of the model's text (the line after
``Action:``, everything after it, a fenced SQL block) and which answer fields hold the observation, the reward and
the end of the episode. :data:`ADAPTERS` writes those down per environment, read from AgentGym's clients and
servers; an AgentGym environment is then named ``agentgym:<name>`` wherever credo takes an environment name::

    credo train --config agent_agentgym agent.remote.env=textcraft agent.remote.url=http://127.0.0.1:36001

Anything else (another server, other field names) is an :class:`AgentGymAdapter` registered from a plugin module
(``plugins: [my_module]`` or ``--plugin my_module``) with :func:`register_adapter`, or the fields of an adapter
overridden in ``agent.remote.contract``.

Where credo differs from AgentGym's clients (docs/agents.md): a turn without an action (no ``Action:``, or two of
them) is answered "invalid action" without calling the server, where TextCraft's client sends an empty action; an
answer ``{"error": ...}`` (AgentGym servers answer failures with status 200) is an environment failure, not an
observation.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from credo.envs.base import PREFIXES, EnvSpec, StepResult
from credo.envs.client import EnvError, HTTPEnvClient, _is_number
from credo.registry import Registry, UnknownName

PREFIX = "agentgym:"
MAX_ACTION_TEXT = 64 << 10  # model text past this many characters is not searched for an action


# ------------------------------------------------------------------------------------------ action extraction

def action_line(text: str) -> str | None:
    """TextCraft's and BabyAI's clients: the one line after ``Action:``, reduced to letters, digits, commas and
    single spaces; None when there is no ``Action:`` or more than one."""
    found = re.findall(r"Action:[ \t\r\n]*([^\n]*)", text)
    if len(found) != 1:
        return None
    action = " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", found[0]).split())
    return action or None


def action_after(text: str) -> str | None:
    """LMRL-Gym's clients (maze, wordle): the text after the first ``Action:`` (the whole text without one),
    stripped, without a trailing ``</s>``."""
    text = text.removesuffix("</s>")
    parts = text.split("Action:")
    action = (parts[1] if len(parts) > 1 else parts[0]).strip()
    return action or None


def action_react(text: str) -> str | None:
    """AgentGym's ReAct format (WebShop, ALFWorld): the text after the last ``Action:``; None without one."""
    text = text.removesuffix("</s>")
    if "Action:" not in text:
        return None
    return text.rsplit("Action:", 1)[1].strip() or None


def action_sql(text: str) -> str | None:
    """SqlGym's client: the body of the last fenced ```sql block (the text itself without a fence)."""
    action = text.split("```sql")[-1].split("```")[0].strip()
    return action or None


# AgentGymAdapter.action -> how the action is cut out of the model's text (a plugin may register another)
EXTRACTORS: Registry[Callable[[str], str | None]] = Registry("AgentGym action extractor")
for _name, _fn in (("line", action_line), ("after", action_after), ("react", action_react), ("sql", action_sql)):
    EXTRACTORS.add(_name, _fn)


@dataclass(frozen=True)
class TextAction:
    """An :class:`~credo.envs.base.ActionParser` look-alike for AgentGym's text actions (no tags to stop at)."""

    kind: str
    tags: tuple[str, ...] = ()

    def parse(self, text: str) -> str | None:
        return EXTRACTORS[self.kind](text[:MAX_ACTION_TEXT])


# ------------------------------------------------------------------------------------------ the adapter table

@dataclass(frozen=True)
class AgentGymAdapter:
    """One AgentGym environment server's contract (the fields its client sends and reads)."""

    name: str
    instruction: str  # what the agent is told before the first observation (credo's wording)
    prefix: str = ""  # route prefix: "/maze" for LMRL-Gym's maze
    id_field: str = "id"  # how an instance is named in bodies and queries: "id" or "env_idx"
    reset_field: str = "data_idx"  # the reset body's task field
    reset_extra: dict = field(default_factory=dict)  # more reset fields, e.g. ALFWorld's {"world_type": "Text"}
    create_body: dict | None = field(default_factory=dict)  # body of POST /create (None: none; TextCraft needs {})
    action: str = "line"  # how the action is cut out of the model's text: a key of EXTRACTORS
    first_observation: str = "reset"  # "reset": the reset answer holds it; "get": GET /observation
    reset_text: tuple[str, ...] = ("observation",)  # reset-answer fields joined by newlines as the first observation
    observation_field: str = "observation"  # the step answer's observation ("state" on WebShop and SqlGym)
    reward_field: str = "reward"  # the step answer's reward ("score" on BabyAI)
    done_field: str = "done"
    reward: str = "last"  # the episode's reward: "last" step's, or the "sum" of every step's (LMRL-Gym's maze)
    success: str = "reward"  # success: "reward" > 0 at the end, or "done" (the episode ended before the cap)
    train_ids: tuple[int, int] = (100, 10_000)  # [lo, hi) task ids drawn for training
    eval_ids: tuple[int, int] = (0, 100)  # [lo, hi) held-out task ids, taken in order

    def check(self) -> None:
        """Raise ValueError in one line when a field names nothing credo knows."""
        choices = {"id_field": ("id", "env_idx"), "action": tuple(EXTRACTORS), "first_observation": ("reset", "get"),
                   "reward": ("last", "sum"), "success": ("reward", "done")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key}={getattr(self, key)!r}: expected one of {', '.join(allowed)}")
        for key in ("train_ids", "eval_ids"):
            lo, hi = getattr(self, key)
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi):
                raise ValueError(f"{key}={[lo, hi]!r}: expected [lo, hi) with 0 <= lo < hi")


_REACT = "Reply in this format, one action per reply:\nThought:\n<your reasoning>\n\nAction:\n<the action>"

# an equal adapter registered again (a plugin module imported twice) is the same entry
ADAPTERS: Registry[AgentGymAdapter] = Registry("AgentGym adapter", same=lambda a, b: a == b)


def register_adapter(adapter: AgentGymAdapter) -> AgentGymAdapter:
    """Add ``adapter`` to the table (a plugin module's way to make ``agentgym:<name>`` known)."""
    adapter.check()
    return ADAPTERS.add(adapter.name, adapter)


for _adapter in (
    AgentGymAdapter("textcraft", "Craft the goal item in Minecraft with the crafting commands given. Actions: "
                    "'get N item' (items no command crafts), 'craft N item using N ingredient, ...' (exactly as a "
                    "command says), 'inventory'. " + _REACT + "\nExample:\nThought:\nI need lapis lazuli for the "
                    "blue dye.\n\nAction:\nget 1 lapis lazuli",
                    train_ids=(100, 544)),  # 544 goals; AgentGym's server takes data_idx modulo 544
    AgentGymAdapter("babyai", "Reach the goal in the grid world. Actions: turn left, turn right, move forward, "
                    "go to <obj> <id>, pick up <obj> <id>, go through <door> <id>, toggle and go through <door> "
                    "<id>, toggle. " + _REACT, reward_field="score"),
    AgentGymAdapter("maze", "Reach the goal of the maze. Actions: move up, move down, move left, move right. "
                    + _REACT, prefix="/maze", reset_field="game", action="after", reward="sum", success="done"),
    AgentGymAdapter("wordle", "Guess the hidden 5-letter word in 6 tries; write a guess as space-separated "
                    "letters (s h i r e); feedback per letter: b absent, y elsewhere, g right. " + _REACT,
                    prefix="/wordle", reset_field="seed", action="after", reward="sum", success="done"),
    AgentGymAdapter("alfworld", "Complete the household task. " + _REACT, reset_field="game", action="react",
                    reset_extra={"world_type": "Text"}),
    AgentGymAdapter("webshop", "Buy the product that matches the instruction. Actions: search[query], "
                    "click[button]. " + _REACT, id_field="env_idx", reset_field="session_id",
                    action="react", first_observation="get", observation_field="state"),
    AgentGymAdapter("sqlgym", "Answer the question with one SQL query in a ```sql fenced block.", id_field="env_idx",
                    reset_field="item_id", action="sql", first_observation="get", observation_field="state"),
):
    register_adapter(_adapter)


def adapter_names() -> list[str]:
    return ADAPTERS.names()


def get_adapter(name: str, contract: dict | None = None) -> AgentGymAdapter:
    """The adapter ``name`` (``agentgym:`` prefix optional) with the fields of ``contract`` replaced."""
    try:
        adapter = ADAPTERS.get(name.removeprefix(PREFIX))
    except UnknownName as exc:
        raise UnknownName(f"{exc} (a plugin module can add one with credo.envs.agentgym.register_adapter)") from None
    if not contract:
        return adapter
    known = {f.name for f in dataclasses.fields(AgentGymAdapter)} - {"name"}
    unknown = sorted(set(contract) - known)
    if unknown:
        raise ValueError(f"contract: {unknown} are not adapter fields; known: {', '.join(sorted(known))}")
    values = {k: tuple(v) if k in ("train_ids", "eval_ids", "reset_text") else v for k, v in contract.items()}
    adapter = dataclasses.replace(adapter, **values)
    adapter.check()
    return adapter


def _no_local_instance(name: str):
    def factory(**_: Any):
        raise ValueError(f"{PREFIX}{name} runs on an AgentGym server: give its URL (agent.remote.url, or "
                         f"rollout.collector.server_urls)")
    return factory


def remote_spec(env: str) -> EnvSpec:
    """The EnvSpec credo's agent code sees for ``agentgym:<name>``: the adapter's action extraction and
    instruction, no in-process instance, no oracle (no warm start from demonstrations)."""
    adapter = get_adapter(env)
    return EnvSpec(name=PREFIX + adapter.name, factory=_no_local_instance(adapter.name),
                   parser=TextAction(adapter.action), instruction=adapter.instruction)  # type: ignore[arg-type]


PREFIXES.add(PREFIX, remote_spec)


def is_remote(env: str) -> bool:
    return env.startswith(PREFIX)


# ------------------------------------------------------------------------------------------ the client

class AgentGymClient(HTTPEnvClient):
    """:class:`~credo.envs.client.HTTPEnvClient`'s transport (retries of idempotent calls, 4xx not retried, bounded
    answers, every failure an :class:`~credo.envs.client.EnvError`) with an AgentGym server's contract."""

    def __init__(self, base_url: str, adapter: AgentGymAdapter, *, instruction: str | None = None,
                 timeout_s: float = 30.0, retries: int = 2, token: str | None = None):
        super().__init__(base_url.rstrip("/") + adapter.prefix, parser=TextAction(adapter.action),  # type: ignore
                         instruction=adapter.instruction if instruction is None else instruction,
                         timeout_s=timeout_s, retries=retries, token=token)
        self.adapter, self.name = adapter, PREFIX + adapter.name
        self._total = 0.0

    def _body(self, **fields: Any) -> dict[str, Any]:
        return {self.adapter.id_field: self.env_id, **fields}

    def reset(self, task_id: int) -> str:
        a = self.adapter
        if self.env_id is None:
            self.env_id = self._create()
        body = _ok(self, self._call("POST", "/reset", self._body(**{a.reset_field: task_id}, **a.reset_extra)))
        self._total = 0.0
        if a.first_observation == "get":
            got = _ok(self, self._call("GET", f"/observation?{a.id_field}={self.env_id}"))
            obs = got if isinstance(got, str) else (got or {}).get(a.observation_field) if isinstance(got, dict) \
                else None
        else:
            parts = [body.get(k) for k in a.reset_text] if isinstance(body, dict) else [None]
            obs = "\n".join(parts) if all(isinstance(p, str) for p in parts) else None
        if not isinstance(obs, str):
            raise EnvError(f"{self.name}: reset answered no observation: {repr(body)[:200]}")
        return obs

    def step(self, text: str) -> StepResult:
        a = self.adapter
        action = self.parser.parse(text)
        if action is None:
            return StepResult("invalid action: end your reply with 'Action:' and one action", 0.0, False,
                              {"invalid_action": True})
        body = _ok(self, self._call("POST", "/step", self._body(action=action), idempotent=False))
        obs, reward, done = (body.get(k) if isinstance(body, dict) else None
                             for k in (a.observation_field, a.reward_field, a.done_field))
        if not isinstance(obs, str) or not _is_number(reward) or not isinstance(done, bool):
            raise EnvError(f"{self.name}: malformed step answer: {repr(body)[:200]}")
        self._total += float(reward)
        value = self._total if a.reward == "sum" else float(reward)
        info = {"success": bool(done) if a.success == "done" else value > 0} if done else {}
        return StepResult(obs, value, done, info)

    def close(self) -> None:
        if self.env_id is not None:
            try:
                self._call("POST", "/close", self._body())
            except EnvError:
                pass
            self.env_id = None

    def _create(self) -> int:
        body = _ok(self, self._call("POST", "/create", self.adapter.create_body))
        env_id = body if isinstance(body, int) else body.get(self.adapter.id_field, body.get("id")) \
            if isinstance(body, dict) else None
        if not isinstance(env_id, int) or isinstance(env_id, bool):
            raise EnvError(f"{self.name}: create answered no id: {repr(body)[:200]}")
        return env_id


def _ok(client, body: Any) -> Any:
    """``body``, unless it is AgentGym's failure answer ``{"error": ...}`` (sent with status 200)."""
    if isinstance(body, dict) and "error" in body and len(body) == 1:
        raise EnvError(f"{client.name}: the server answered error: {str(body['error'])[:200]}")
    return body
