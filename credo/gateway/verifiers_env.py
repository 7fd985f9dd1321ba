"""verifiers environments as gateway agents (docs/bring-your-own.md, "verifiers environments").

``load_environment_agent({"env": ID, "args": {...}})`` loads a `verifiers <https://pypi.org/project/verifiers/>`_
v1 environment (a taskset, the env that plays it, its rewards and judges) and returns an
:class:`~credo.gateway.contract.AgentSource`: ``rows`` are the taskset's tasks, and calling it on a row runs
verifiers' own episode (``Env.run_episode``: its interception server, the seat's harness, tool servers, the
task's ``@vf.reward`` functions and plugged judges) against the episode's OpenAI-compatible endpoint, returning
``{"reward": total, <reward name>: weighted value, ...}``.

``ID`` resolves like verifiers' own loader: an importable module or installed package (``my_env``), a built-in
adapter (``openenv``, ``textarena``, ``nemo_gym``, ``harbor``), a local file or package folder
(``path/to/my_env.py``: its folder joins ``sys.path`` and ``PYTHONPATH``), or an Environments Hub id
(``owner/name[@version]``: the installed ``name`` if there is one, else ``prime env install`` when the ``prime``
command is on PATH; without it, or with the hub unreachable, the error says so).

What stays local: every seat runs in verifiers' ``subprocess`` runtime with :data:`HARNESS_ID`: verifiers' own
chat program (its ``null`` harness: chat loop + MCP tools) run in this process, on the episode's event loop,
instead of in a ``uv`` environment it would download; the interception server binds 127.0.0.1 and no tunnel is opened; a seat pinning
its own endpoint, a remote runtime, a tool server or judge whose URL is not on this machine is refused at load
unless its host is listed in ``allow_hosts``.
"""
from __future__ import annotations

import asyncio
import contextvars
import importlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import threading
import traceback
import types
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from credo.gateway.contract import AgentClient

log = logging.getLogger(__name__)

HARNESS_ID = "credo_vf_host_chat"
"""The harness id every seat runs with unless ``spec["harness"]`` names another: verifiers' ``null`` chat
program run in this process (no ``uv`` bootstrap, nothing downloaded, no interpreter start per episode)."""

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0:0:0:0:0:0:0:1"}
_BUILTIN_TASKSETS = ("openenv", "textarena", "nemo_gym", "harbor")
SPEC_KEYS = frozenset({"env", "args", "eval_args", "env_id", "harness", "max_turns", "timeout_s", "sampling",
                       "allow_hosts", "hub_install_timeout_s"})
"""The keys of ``rollout.collector.verifiers`` (docs/bring-your-own.md)."""


class VerifiersEnvError(ValueError):
    """A verifiers environment that cannot be loaded or run here (the message says why and what to do)."""


class VerifiersEpisodeError(RuntimeError):
    """A verifiers episode that failed (its harness, a tool server, a reward or judge raised): the collector
    counts it as a failed episode."""


# ----------------------------------------------------------------------------------------------------------
# the host harness: verifiers' chat program without uv


_ARGS: contextvars.ContextVar = contextvars.ContextVar("credo_vf_chat_args")
_PROGRAM: dict | None = None


def _chat_program() -> dict:
    """verifiers' bundled chat program (``CHAT_PROGRAM_SOURCE``: its ``mcp``, ``compaction`` and ``core`` modules
    in one namespace, as the script it writes for its ``null`` harness), compiled once in this process; its
    ``parse_args`` reads the arguments of the calling episode (a context variable) instead of ``sys.argv``."""
    global _PROGRAM
    if _PROGRAM is None:
        from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

        ns: dict[str, Any] = {"__name__": "credo_vf_chat_program", "__builtins__": __builtins__}
        exec(compile(CHAT_PROGRAM_SOURCE, "<verifiers chat program>", "exec"), ns)  # noqa: S102 - verifiers' own
        ns["argv_parse_args"] = ns["parse_args"]
        ns["parse_args"] = _ARGS.get
        _PROGRAM = ns
    return _PROGRAM


class _InProcessRuntime:
    """A view of a subprocess runtime that runs verifiers' chat program in this process, on the episode's event
    loop (verifiers' ``Harness.launch`` allows an in-process loop when every model call goes through the
    interception endpoint): no interpreter start per episode, no ``uv`` environment to download."""

    def __init__(self, runtime: Any):
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: dict | None = None, *,
                                activate: bool = True) -> list[str]:
        return ["<verifiers chat program>"]

    async def run_program(self, argv: list[str], env: dict[str, str]):
        from verifiers.v1.runtimes import ProgramResult

        ns = _chat_program()
        saved = sys.argv
        try:
            sys.argv = ["verifiers-chat", *argv[1:]]
            args = ns["argv_parse_args"]()
        except SystemExit as e:  # argparse's refusal
            return ProgramResult(exit_code=int(e.code or 2), stdout="", stderr=f"bad chat program arguments {argv}")
        finally:
            sys.argv = saved
        workdir = getattr(self._runtime, "workdir", None)
        if args.initial_messages_file and workdir is not None and not os.path.isabs(args.initial_messages_file):
            args.initial_messages_file = str(Path(workdir) / args.initial_messages_file)
        token = _ARGS.set(args)
        try:
            await ns["main"]()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
            return ProgramResult(exit_code=code, stdout="", stderr=_cause(e))
        except Exception:  # the program's crash, as its exit status and traceback
            return ProgramResult(exit_code=1, stdout="", stderr=traceback.format_exc())
        finally:
            _ARGS.reset(token)
        return ProgramResult(exit_code=0, stdout="", stderr="")


def _cause(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    return f"{type(cause).__name__}: {cause}" if cause is not None else ""


def _harness_module() -> types.ModuleType:
    """The plugin module verifiers imports for :data:`HARNESS_ID` (its loader resolves a harness id to a
    top-level module exporting one ``Harness`` subclass in ``__all__``); registered in ``sys.modules``."""
    existing = sys.modules.get(HARNESS_ID)
    if existing is not None:
        return existing
    from verifiers.v1.harnesses.null import NullHarness, NullHarnessConfig
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE, launch_chat_program

    class CredoHostChatHarness(NullHarness):
        """verifiers' ``null`` harness (chat loop with the task's MCP tools), its program run in-process."""

        async def setup(self, runtime: Any) -> None:
            if getattr(runtime, "type", None) != "subprocess":
                raise VerifiersEnvError(f"harness {HARNESS_ID!r} runs only in the subprocess runtime, not "
                                        f"{getattr(runtime, 'type', runtime)!r}")

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data,
                         tool_interception_url=None):
            system_prompt, prompt = self.resolve_prompt(data)
            extra = [f"--tool-interception-url={tool_interception_url}"] if tool_interception_url else []
            return await launch_chat_program(CHAT_PROGRAM_SOURCE, self.config, ctx, trace,
                                             _InProcessRuntime(runtime), endpoint, secret, mcp_urls,
                                             system_prompt, prompt, extra_args=extra)

    module = types.ModuleType(HARNESS_ID, "credo's in-process chat harness for verifiers "
                                          "(credo.gateway.verifiers_env)")
    module.__spec__ = importlib.util.spec_from_loader(HARNESS_ID, loader=None)
    CredoHostChatHarness.__module__ = HARNESS_ID
    module.CredoHostChatHarness = CredoHostChatHarness
    module.NullHarnessConfig = NullHarnessConfig
    module.__all__ = ["CredoHostChatHarness"]
    sys.modules[HARNESS_ID] = module
    return module


# ----------------------------------------------------------------------------------------------------------
# resolving the env id


def _add_path(folder: Path) -> None:
    folder = folder.resolve()
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(folder) not in parts:  # tool servers start as `python -m <module>` and must import it too
        os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *parts])


def _module_name(name: str) -> str:
    return name.replace("-", "_").lower()


def _importable(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def resolve_env_id(env: str, *, install_timeout_s: float = 600.0) -> str:
    """The taskset id verifiers loads for ``env`` (see the module docstring), installing a hub id through the
    ``prime`` CLI when it is not installed yet. Raises :class:`VerifiersEnvError` with what to do."""
    if not isinstance(env, str) or not env.strip():
        raise VerifiersEnvError("rollout.collector.verifiers.env needs an environment id (a module name, a "
                                "path to a .py file or package folder, or an Environments Hub id owner/name)")
    env = env.strip()
    path = Path(env)
    if env.endswith(".py") or (path.exists() and (path / "__init__.py").exists()):
        if not path.exists():
            raise VerifiersEnvError(f"verifiers environment file {env!r} does not exist")
        _add_path(path.parent)
        module = path.stem if path.is_file() else path.name
        if not module.isidentifier():
            raise VerifiersEnvError(f"verifiers environment {env!r}: {module!r} is not a module name")
        return module
    if "/" in env:
        return _resolve_hub_id(env, install_timeout_s)
    if "." in env:
        raise VerifiersEnvError(f"verifiers environment {env!r}: verifiers loads a top-level module or package "
                                "(its taskset plugin loader takes no dotted path); name the package, or give "
                                "the path to its .py file or folder")
    module = _module_name(env)
    if env in _BUILTIN_TASKSETS or _importable(module):
        return env
    raise VerifiersEnvError(f"verifiers environment {env!r} not found: no module {module!r} is importable and "
                            f"it is none of the bundled adapters ({', '.join(_BUILTIN_TASKSETS)}). Install the "
                            "environment's package, give the path to its .py file, or an Environments Hub id "
                            "owner/name")


def _resolve_hub_id(env: str, install_timeout_s: float) -> str:
    owner_name = env.split("@", 1)[0]
    if owner_name.count("/") != 1 or not all(owner_name.split("/")):
        raise VerifiersEnvError(f"verifiers environment {env!r}: an Environments Hub id is owner/name[@version]")
    module = _module_name(owner_name.split("/")[1])
    if _importable(module):
        return env
    prime = shutil.which("prime")
    if prime is None:
        raise VerifiersEnvError(f"verifiers environment {env!r} is an Environments Hub id and its package "
                                f"{module!r} is not installed; the hub is reached through the prime CLI "
                                f"(`prime env install {env}`), which is not on PATH here. Install the "
                                "environment's package yourself, or install the prime CLI")
    try:
        done = subprocess.run([prime, "env", "install", env], capture_output=True, text=True,
                              timeout=install_timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise VerifiersEnvError(f"verifiers environment {env!r}: `prime env install {env}` did not finish in "
                                f"{install_timeout_s:g} s (is the Environments Hub reachable?)") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-800:]
        raise VerifiersEnvError(f"verifiers environment {env!r}: `prime env install {env}` failed (exit "
                                f"{done.returncode}); the Environments Hub may be unreachable from here: {tail}")
    importlib.invalidate_caches()
    if not _importable(module):
        raise VerifiersEnvError(f"verifiers environment {env!r}: `prime env install` succeeded but module "
                                f"{module!r} is still not importable by {sys.executable}")
    return env


# ----------------------------------------------------------------------------------------------------------
# building the env


def _seat_overrides(spec: dict) -> dict:
    seat: dict[str, Any] = {"runtime": {"type": "subprocess"},
                            "harness": {"id": spec.get("harness") or HARNESS_ID},
                            "network_notice": False}
    if spec.get("max_turns") is not None:
        seat["max_turns"] = int(spec["max_turns"])
    if spec.get("timeout_s") is not None:
        seat["timeout"] = {"rollout": float(spec["timeout_s"])}
    return seat


def _env_config(taskset_id: str, args: dict, spec: dict):
    import verifiers.v1 as vf

    if not spec.get("harness"):
        _harness_module()
    env_id = spec.get("env_id") or ""
    try:
        cls = vf.env_config_type(taskset_id, env_id)
    except ModuleNotFoundError as e:
        raise VerifiersEnvError(f"verifiers environment {taskset_id!r}: {e}") from e
    except (TypeError, AttributeError, ValueError) as e:
        raise VerifiersEnvError(f"verifiers environment {taskset_id!r} is not a verifiers v1 taskset "
                                f"package: {e}") from e
    raw: dict[str, Any] = {"id": env_id, "taskset": {**dict(args or {}), "id": taskset_id}}
    seat = _seat_overrides(spec)
    for name, field in cls.model_fields.items():
        if isinstance(field.default, vf.AgentConfig):
            raw[name] = dict(seat)
    try:
        return vf.resolve_env_config(raw)
    except Exception as e:  # pydantic's ValidationError names the field; keep it
        raise VerifiersEnvError(f"verifiers environment {taskset_id!r}: bad args: {e}") from e


def _host_of(url: str | None) -> str | None:
    return (urlparse(url).hostname or "").lower() if url else None


def _check_local(config, env, allow_hosts: set[str]) -> None:
    """Refuse what would reach a host other than this machine (and ``allow_hosts``) or start a sandbox."""
    import verifiers.v1 as vf
    from verifiers.v1.runtimes import runtime_is_local

    allowed = _LOOPBACK | allow_hosts

    def remote(url: str | None) -> bool:
        return "*" not in allow_hosts and _host_of(url) not in allowed

    for name, seat in config:
        if not isinstance(seat, vf.AgentConfig):
            continue
        if seat.runtime.type != "subprocess":
            raise VerifiersEnvError(f"seat {name!r} runs in the {seat.runtime.type!r} runtime; credo runs "
                                    "verifiers seats in the local subprocess runtime only")
        if seat.client is not None and remote(seat.client.base_url):
            raise VerifiersEnvError(f"seat {name!r} pins its own endpoint {seat.client.base_url!r}; credo's "
                                    "gateway serves every seat (list the host in allow_hosts to allow it)")
    taskset = env.taskset
    task_cls = type(taskset).task_type()
    servers = [*taskset.toolsets(taskset.config), *task_cls.toolsets(taskset.config.task)]
    for server in servers:
        cfg = server.config
        url = getattr(cfg, "url", None)
        if url and remote(url):
            raise VerifiersEnvError(f"tool server {server.server_name!r} is remote ({url}); list its host in "
                                    "allow_hosts to allow it")
        if not url and not runtime_is_local(cfg.runtime):
            raise VerifiersEnvError(f"tool server {server.server_name!r} runs in the {cfg.runtime.type!r} "
                                    "runtime; credo runs verifiers tool servers locally only")
    tcfg = taskset.config
    if getattr(tcfg, "base_url", None) and remote(tcfg.base_url):  # an adapter's server (OpenEnv's base_url)
        raise VerifiersEnvError(f"taskset {config.taskset.id!r} connects to {tcfg.base_url!r}; list its host in "
                                "allow_hosts to allow it")
    if config.taskset.id == "openenv" and not getattr(tcfg, "base_url", None) and "*" not in allow_hosts:
        raise VerifiersEnvError("the openenv adapter without args.base_url starts its environment through uv or "
                                "docker, which download it: start the OpenEnv server yourself and give "
                                "args.base_url (or allow_hosts: ['*'])")
    for judge in tcfg.task.judges:
        if remote(judge.base_url):
            raise VerifiersEnvError(
                f"judge {judge.id!r} calls {judge.base_url!r}; set its base_url to an endpoint on this machine "
                "(args.task.judges[i].base_url) or list the host in allow_hosts")


def _load_env(config):
    import verifiers.v1 as vf

    try:
        return vf.load_environment(config)
    except (ModuleNotFoundError, TypeError, AttributeError, ValueError) as e:
        raise VerifiersEnvError(f"verifiers environment {config.taskset.id!r} failed to load: {e}") from e


# ----------------------------------------------------------------------------------------------------------
# the agent source


class _LoopEnv:
    """An Env serving (its interception server, the taskset's shared tool servers) on one event loop while
    episodes run there: entered by the first episode, left by the last (the collector runs each step on a loop of
    its own)."""

    def __init__(self, env):
        self.env = env
        self.active = 0  # episodes inside serving
        self.claims = 0  # episodes holding this entry (claimed before entering, released after leaving)
        self.lock = asyncio.Lock()
        self.serving: Any = None

    async def enter(self) -> None:
        async with self.lock:
            if self.active == 0:
                cm = self.env.serving()
                await cm.__aenter__()
                self.serving = cm
            self.active += 1

    async def leave(self) -> None:
        async with self.lock:
            self.active -= 1
            if self.active == 0 and self.serving is not None:
                cm, self.serving = self.serving, None
                await cm.__aexit__(None, None, None)


class VerifiersEnvAgent:
    """A loaded verifiers environment as an :class:`~credo.gateway.contract.AgentSource`."""

    def __init__(self, spec: dict):
        unknown = set(spec) - SPEC_KEYS
        if unknown:
            raise VerifiersEnvError(f"rollout.collector.verifiers has unknown keys {sorted(unknown)}; known: "
                                    f"{sorted(SPEC_KEYS)}")
        self.spec = dict(spec)
        self.taskset_id = resolve_env_id(spec.get("env", ""),
                                         install_timeout_s=float(spec.get("hub_install_timeout_s") or 600.0))
        self.allow_hosts = {str(h).lower() for h in (spec.get("allow_hosts") or [])}
        self.config = _env_config(self.taskset_id, spec.get("args") or {}, self.spec)
        self.env = _load_env(self.config)
        _check_local(self.config, self.env, self.allow_hosts)
        self.eval_config = None
        self._eval_env = None
        if spec.get("eval_args") is not None:
            self.eval_config = _env_config(self.taskset_id, {**(spec.get("args") or {}), **spec["eval_args"]},
                                           self.spec)
            self._eval_env = _load_env(self.eval_config)
            _check_local(self.eval_config, self._eval_env, self.allow_hosts)
        self.name = self.config.env_id
        self._tasks: dict[str, Any] = {}
        # an Env serves on one event loop at a time (its serving resources are its attributes): per split, the Envs
        # serving now, by loop, and the idle ones
        self._serving: dict[tuple[Any, str], _LoopEnv] = {}
        self._idle: dict[str, list] = {"train": [self.env], "eval": [self._eval_env] if self._eval_env else []}
        self._lock = threading.Lock()

    # -- rows ---------------------------------------------------------------------------------------------

    def _taskset(self, split: str):
        if split == "train":
            return self.env.taskset, self.config
        if split == "eval":
            if self._eval_env is not None:
                return self._eval_env.taskset, self.eval_config
            return self.env.taskset, self.config
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")

    def rows(self, split: str, size: int, seed: int) -> list[dict]:
        """At most ``size`` task rows of the taskset (``eval_args`` select the eval split's, else the train
        taskset is used for both), shuffled with ``seed`` when the taskset is finite."""
        taskset, _ = self._taskset(split)
        view = taskset.shuffle(seed) if taskset.bounded else taskset
        if size is not None and size >= 0:
            view = view.take(int(size))
        elif not view.bounded:
            raise VerifiersEnvError(f"verifiers taskset {self.name!r} is infinite: give a size")
        rows = []
        for task in view:
            row = self._row(task, split)
            self._tasks[row["uid"]] = task
            rows.append(row)
        if not rows:
            raise VerifiersEnvError(f"verifiers environment {self.name!r} yielded no tasks for split {split!r} "
                                    f"(args {self.spec.get('eval_args' if split == 'eval' else 'args') or {}})")
        return rows

    def _row(self, task, split: str) -> dict:
        data = task.data
        dumped = data.model_dump(mode="json", exclude_none=True)
        answer = getattr(data, "answer", None)
        return {
            "uid": f"vf:{self.name}:{split}:{data.idx}",
            "prompt": data.prompt_text,
            "answer": None if answer is None else (answer if isinstance(answer, str) else str(answer)),
            "info": {k: v for k, v in dumped.items() if k not in ("prompt", "answer")},
            "vf_task": dumped,
            "vf_split": split,
        }

    def _task_of(self, row: dict):
        task = self._tasks.get(row.get("uid"))
        if task is not None:
            return task
        if "vf_task" not in row:
            raise VerifiersEnvError(f"task row {row.get('uid')!r} did not come from this verifiers environment "
                                    "(no vf_task field)")
        taskset, _ = self._taskset(row.get("vf_split", "train"))
        task_cls = type(taskset).task_type()
        return task_cls(task_cls.data_type().model_validate(row["vf_task"]), taskset.config.task)

    # -- one episode ----------------------------------------------------------------------------------------

    def _enter_env(self, split: str) -> _LoopEnv:
        split = split if split == "eval" and self._eval_env is not None else "train"
        key = (asyncio.get_running_loop(), split)
        with self._lock:
            entry = self._serving.get(key)
            if entry is None:
                idle = self._idle[split]
                env = idle.pop() if idle else _load_env(self.eval_config if split == "eval" else self.config)
                entry = self._serving[key] = _LoopEnv(env)
            entry.claims += 1
            return entry

    def _release_env(self, split: str, entry: _LoopEnv) -> None:
        split = split if split == "eval" and self._eval_env is not None else "train"
        key = (asyncio.get_running_loop(), split)
        with self._lock:
            entry.claims -= 1
            if entry.claims == 0 and self._serving.get(key) is entry:
                del self._serving[key]
                self._idle[split].append(entry.env)

    async def __call__(self, task: dict, client: AgentClient) -> dict[str, float]:
        """Run one verifiers episode of ``task`` against ``client`` and return its rewards."""
        from verifiers.v1 import ModelContext
        from verifiers.v1.clients import EvalClientConfig
        from verifiers.v1.types import SamplingConfig

        vf_task = self._task_of(task)
        split = task.get("vf_split", "train")
        entry = self._enter_env(split)
        # verifiers reads an endpoint's key from an environment variable; one per episode (the key scopes the
        # episode's calls); "API_KEY" in the name keeps it out of the subprocess runtime's environment.
        key_var = f"CREDO_VF_API_KEY_{uuid.uuid4().hex}"
        os.environ[key_var] = client.api_key
        try:
            ctx = ModelContext(
                model=client.model,
                client=EvalClientConfig(base_url=client.base_url, api_key_var=key_var,
                                        timeout={"connect": 30.0, "read": client.timeout_s}),
                sampling=SamplingConfig.model_validate(self.spec.get("sampling") or {}))
            try:
                await entry.enter()
                try:
                    episode = await entry.env.run_episode(vf_task, ctx)
                finally:
                    await entry.leave()
            finally:
                self._release_env(split, entry)
        finally:
            os.environ.pop(key_var, None)
        return episode_rewards(episode)


def episode_rewards(episode) -> dict[str, float]:
    """``{"reward": total, <name>: weighted value}`` over the episode's trainable traces (all traces when none
    is marked trainable; a reward function named ``reward`` reports as ``vf_reward``); a failed episode, or a
    reward left unscored, raises :class:`VerifiersEpisodeError`."""
    errors = [e for t in episode.traces for e in t.errors] + list(episode.errors)
    if not episode.ok or not episode.traces:
        detail = "; ".join(f"{e.type}: {e.message}" for e in errors)[-1500:] or "no trace"
        raise VerifiersEpisodeError(f"verifiers episode failed: {detail}")
    traces = [t for t in episode.traces if t.agent is None or t.agent.trainable] or list(episode.traces)
    comps: dict[str, float] = {}
    for trace in traces:
        for name, reward in trace.rewards.items():
            if reward is None:
                raise VerifiersEpisodeError(f"verifiers reward {name!r} was not scored")
            key = "vf_reward" if name == "reward" else name  # "reward" is the total's key in credo's contract
            comps[key] = comps.get(key, 0.0) + reward.value
    return {"reward": float(sum(t.reward for t in traces)), **comps}


def load_environment_agent(spec: dict) -> VerifiersEnvAgent:
    """The :class:`~credo.gateway.contract.AgentSource` for ``rollout.collector.verifiers`` (``env``, ``args``,
    ``eval_args``, ``env_id``, ``harness``, ``max_turns``, ``timeout_s``, ``sampling``, ``allow_hosts``); see
    docs/bring-your-own.md."""
    if not isinstance(spec, dict):
        raise VerifiersEnvError(f"rollout.collector.verifiers must be a mapping, not {type(spec).__name__}")
    return VerifiersEnvAgent(spec)
