"""The ``rollout.collector`` section of ``type: agent``: multi-turn agent episodes, rewards from environments
(was the ``agent`` section)."""
from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass

from credo.config.fields import opt, type_key
from credo.config.reads import READERS, Reader, warm_start_on
from credo.config.validate import ConfigError, did_you_mean, register_validator, wrap


@dataclass
class RemoteEnvConfig:
    """An AgentGym environment server trained on with no user code (also reachable as ``agent.remote.*``)."""

    env: str | None = opt(None, "AgentGym environment of the adapter table (credo env list): textcraft, babyai, "
                          "maze, wordle, alfworld, webshop, sqlgym, or one a plugin registered; trained as "
                          "agentgym:<env>; null = none")
    url: str | None = opt(None, "base URL of its server, e.g. http://127.0.0.1:36001")
    train_ids: list | None = opt(None, "[lo, hi): training task ids drawn from this range (null = the adapter's)",
                                 read_if="remote_env")
    eval_ids: list | None = opt(None, "[lo, hi): held-out task ids, in order (null = the adapter's)",
                                read_if="remote_env")
    instruction: str | None = opt(None, "what the agent is told before the first observation (null = the adapter's)",
                                  read_if="remote_env")
    contract: dict = opt(None, "adapter fields to override: prefix, id_field, reset_field, reset_extra, create_body, "
                         "action (line|after|react|sql), first_observation, reset_text, observation_field, "
                         "reward_field, done_field, reward (last|sum), success (reward|done) (docs/agents.md)",
                         factory=dict, read_if="remote_env")


@dataclass
class ToolsConfig:
    """Structured tool calling (docs/tools.md), used when the run's environments are tools environments
    (``calc_tools``, ``toolgraph_tools``)."""

    parser: str = opt("hermes", "the model's native tool-call format: hermes (<tool_call>{json}</tool_call>, Qwen2.5) "
                      "or qwen3_coder (<tool_call><function=NAME><parameter=P>..., Qwen3-Coder)",
                      choices=("hermes", "qwen3_coder"))
    chat_template: str = opt("auto", "auto: the tokenizer's chat template when it has one, else credo's tool "
                             "template for character models (credo.tools.render.CHAR_TOOL_TEMPLATE); credo: always "
                             "credo's", choices=("auto", "credo"))
    render: str = opt("auto", "how an episode's ids are built (docs/templates.md): append = token ids appended turn by "
                      "turn; rerender = the conversation rendered afresh before each turn (where it does not extend "
                      "the ids held, they become a training row of their own); auto = append when the chat "
                      "template's extension property holds (credo template check), rerender when it is refuted",
                      choices=("auto", "append", "rerender"))


@dataclass
class AgentCollectorConfig:
    type: str = type_key("agent", "multi-turn agent RL: episodes in environments (credo env list), rewards from them")
    envs: list = opt(None, "environments for multi-turn agent RL (credo env list); empty = single-turn tasks",
                     factory=list)
    env_weights: list | None = opt(None, "mixture weights of envs (per-sample routing); null = uniform")
    env_params: dict = opt(None, "per-environment parameters, e.g. {maze: {size: 5}}", factory=dict)
    server_urls: dict = opt(None, "per-environment HTTP servers (AgentGym contract); others run in-process",
                            factory=dict)
    remote: RemoteEnvConfig = opt(None, "an AgentGym server as one more environment (agent.remote.env / url)",
                                  factory=RemoteEnvConfig)
    stages: list = opt(None, "sequential training: [{envs: [calc], steps: 50}, {envs: [maze], steps: 50}]",
                       factory=list)
    eval_envs: list = opt(None, "environments evaluated on held-out tasks (default: every training env)",
                          factory=list)
    max_turns: int = opt(4, "turn cap per episode (fixed horizon)", min=1)
    horizon_schedule: str = opt("fixed", "ScalingInter-RL: fixed or stepwise", choices=("fixed", "stepwise"))
    horizon_rounds: list = opt(None, "stepwise horizons, e.g. [2, 4, 6]", factory=list, read_if="stepwise_horizon")
    horizon_period: int = opt(100, "steps per stepwise horizon stage", min=1, read_if="stepwise_horizon")
    eval_max_turns: int | None = opt(None, "turn cap at evaluation (null = the largest training horizon)", min=1)
    max_tokens_per_turn: int = opt(24, "generated tokens per assistant turn", min=1)
    max_response_tokens: int = opt(256, "token budget of a whole episode after the prompt", min=8)
    threads: int = opt(8, "concurrent environment steps", min=1)
    kv_reuse: bool = opt(True, "keep each episode's KV cache across turns, so a turn prefills only its new tokens "
                         "(HF engine, Llama-family models; vLLM reuses through its prefix cache); false re-prefills "
                         "the history every turn")
    timeout_s: float = opt(30.0, "whole-call deadline of each HTTP environment request (connect to the reply's "
                           "last byte; a reply is capped at 8 MiB)", min=0.01, read_if="http_envs")
    retries: int = opt(2, "retries of idempotent HTTP environment calls", min=0, read_if="http_envs")
    max_env_failure_share: float = opt(0.5, "stop the run when more than this share of a training step's episodes "
                                       "failed in the environment (server error, timeout, bad answer); such episodes "
                                       "are never trained on (1 = never stop)", min=0.0, max=1.0)
    reward_placement: str = opt("last_action", "outcome reward on the last action token (credo) or the last "
                                "response token (AgentGym-RL reference)", choices=("last_action", "last_token"))
    template: str = opt("auto", "turn template: plain (credo's character models), chat (tokenizer's chat "
                        "template) or auto", choices=("auto", "plain", "chat"))
    branching: str = opt("none", "branching rollouts: none, arpo or aepo", choices=("none", "arpo", "aepo"))
    branch_args: dict = opt(None, "branching hyperparameters (docs/agents.md)", factory=dict, read_if="branching")
    stop_at_action: bool = opt(False, "end each assistant turn at the closing tag of its action (e.g. </move>), as "
                               "ARPO stops at </python>; default: the model ends turns with its end-of-turn token")
    turn_cost: float = opt(0.0, "training reward shaping: subtracted per assistant turn (0 = the env's outcome "
                           "reward only, as AgentGym-RL)", min=0.0)
    invalid_action_cost: float = opt(0.0, "training reward shaping: subtracted per turn without a parseable action",
                                     min=0.0)
    tools: ToolsConfig = opt(None, "structured tool calling: the call parser and chat template (tools "
                             "environments only)", factory=ToolsConfig, read_if="tool_envs")


@dataclass
class GatewayCollectorConfig:
    """The user's own agent against credo's OpenAI-compatible gateway (docs/bring-your-own.md): exactly one of
    ``agent``, ``command`` and ``verifiers``, run ``rollout.group_size`` times per prompt of every step."""

    type: str = type_key("gateway", "your own agent (a Python callable, a command, a verifiers environment) calling "
                         "credo's OpenAI-compatible API on 127.0.0.1; every call is recorded token for token")
    agent: str | None = opt(None, "a Python callable, pkg.module:function, sync or async, called as "
                            "agent(task_row, client) (credo.gateway.contract.AgentClient); returns a reward, a dict "
                            "of reward components or None (the verifier scores)")
    command: str | None = opt(None, "a command run once per episode, e.g. 'python my_agent.py' (split like a shell "
                              "line, run without one), with OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL and "
                              "CREDO_TASK (the task row as JSON) in its environment; the last line of its stdout is "
                              "the reward as JSON: a number, a dict of components, or null (the verifier scores)")
    verifiers: dict | None = opt(None, "a verifiers environment: {env: <module, installed package or hub id>, "
                                 "args: {...}} and the adapter's other keys (docs/bring-your-own.md); its own task "
                                 "rows and rubric (reward) replace task.*")
    concurrency: int = opt(16, "episodes running at once", min=1)
    episode_timeout_s: float = opt(300.0, "deadline of one episode: an agent still running then is a failed episode "
                                   "(its later calls are refused)", min=0.01)
    max_calls: int = opt(32, "model calls per episode; later calls are refused", min=1)
    max_tokens: int = opt(4096, "generated tokens per episode, all calls together; later calls are refused", min=1)
    reward_from: str = opt("agent", "agent = what the agent returns (None: the verifier); verifier = the run's "
                           "reward.* verifier scores the text of the episode's last completion against the row's "
                           "answer", choices=("agent", "verifier"))
    host: str = opt("127.0.0.1", "address the gateway binds (agents on other machines need another one; every "
                    "call still needs its episode's key)")
    port: int = opt(0, "the gateway's port (0 = a free one)", min=0, max=65535)
    tool_parser: str = opt("hermes", "how tool calls are read from the model's completions: hermes "
                           "(<tool_call>{json}</tool_call>, Qwen2.5) or qwen3_coder",
                           choices=("hermes", "qwen3_coder"))
    render: str = opt("auto", "how each call's prompt is built (docs/templates.md): append = an episode's earlier "
                      "answers' sampled ids substituted (calls stitch into one row); rerender = every request rendered "
                      "whole; auto = append when the chat template's extension property holds (credo template "
                      "check), rerender when it is refuted", choices=("auto", "append", "rerender"))
    max_failed_share: float = opt(0.5, "stop the run when more than this share of a training step's episodes failed "
                                  "(the agent raised, timed out, exited non-zero, printed no JSON reward or returned "
                                  "a bad one); failed episodes are never trained on (1 = never stop)",
                                  min=0.0, max=1.0)


REMOTE_PREFIX = "agentgym:"


def remote_name(a: AgentCollectorConfig) -> str | None:
    """``agentgym:<env>`` of ``a.remote``, or None when no remote environment is set."""
    env = a.remote.env
    return REMOTE_PREFIX + env.removeprefix(REMOTE_PREFIX) if env else None


def with_remote(a: AgentCollectorConfig) -> AgentCollectorConfig:
    """``a`` with ``remote`` folded in: ``agentgym:<env>`` appended to ``envs`` (unless ``stages`` name the
    environments, or it is listed already) and ``remote.url`` set as its server."""
    name = remote_name(a)
    if name is None:
        return a
    envs = list(a.envs) if a.stages or name in a.envs else [*a.envs, name]
    urls = {**a.server_urls, name: a.remote.url} if a.remote.url else dict(a.server_urls)
    return dataclasses.replace(a, envs=envs, server_urls=urls)


def remote_adapter(a: AgentCollectorConfig, env: str):
    """The AgentGym adapter of ``agentgym:<name>`` ``env``, with ``remote``'s contract and task ranges when it is
    the remote environment (ValueError / KeyError in one line for a bad one)."""
    from credo.envs.agentgym import get_adapter

    if env != remote_name(a):
        return get_adapter(env)
    r = a.remote
    ranges = {k: v for k, v in (("train_ids", r.train_ids), ("eval_ids", r.eval_ids)) if v is not None}
    return get_adapter(env, {**r.contract, **ranges})


# ----------------------------------------------------------------------------- load-time checks

def _tool_envs(cfg) -> bool:
    from credo.envs import get_env_spec

    a = cfg.rollout.collector
    return any(get_env_spec(e).tools for e in a.envs if isinstance(e, str))


# the readers of this section's conditional keys (credo.config.reads: no silent no-ops)
READERS.add("stepwise_horizon", Reader(lambda c: c.rollout.collector.horizon_schedule == "stepwise",
                                       "rollout.collector.horizon_schedule=stepwise"))
READERS.add("branching", Reader(lambda c: c.rollout.collector.branching != "none",
                                "rollout.collector.branching=arpo or aepo"))
READERS.add("remote_env", Reader(lambda c: c.rollout.collector.remote.env is not None
                                 or c.rollout.collector.remote.url is not None,
                                 "rollout.collector.remote.env or url (an AgentGym server)"))
READERS.add("http_envs", Reader(lambda c: bool(c.rollout.collector.server_urls) or READERS.get("remote_env").when(c),
                                "environments over HTTP (rollout.collector.server_urls or remote)"))
READERS.add("tool_envs", Reader(_tool_envs, "structured-tools environments in rollout.collector.envs"))

@register_validator("rollout.collector.agent")
def validate_agent(cfg) -> None:
    """The agent collector (``rollout.collector``, ``type: agent``): env names, their parameters, stages, horizon
    schedule and branching arguments."""
    if cfg.rollout.collector.type != "agent":
        return
    from credo.envs import make_env

    _check_remote(cfg)
    a = with_remote(cfg.rollout.collector)
    if cfg.model.path is None and cfg.model.max_position_embeddings < a.max_response_tokens + 64:
        raise ConfigError(f"model.max_position_embeddings: {cfg.model.max_position_embeddings} positions cannot hold "
                          f"an episode of rollout.collector.max_response_tokens={a.max_response_tokens} plus its prompt; set it "
                          f"to >= {a.max_response_tokens + 64} or lower rollout.collector.max_response_tokens")
    if a.envs and a.stages:
        raise ConfigError("rollout.collector.stages: set either rollout.collector.envs (one mixture) or rollout.collector.stages (a sequence), not both")
    for i, env in enumerate(a.envs):
        known_env(f"rollout.collector.envs[{i}]", env)
    if a.env_weights is not None:
        if len(a.env_weights) != len(a.envs) or not all(isinstance(w, (int, float)) and w >= 0 for w in a.env_weights) \
                or not sum(a.env_weights) > 0:
            raise ConfigError(f"rollout.collector.env_weights: expected {len(a.envs)} non-negative numbers (one per rollout.collector.envs "
                              f"entry) with a positive sum, got {a.env_weights!r}")
    for i, stage in enumerate(a.stages):
        if not isinstance(stage, dict) or set(stage) != {"envs", "steps"} or not isinstance(stage["envs"], list) \
                or not stage["envs"] or not isinstance(stage["steps"], int) or stage["steps"] < 1:
            raise ConfigError(f"rollout.collector.stages[{i}]: expected {{envs: [name, ...], steps: N>=1}}, got {stage!r}")
        for j, env in enumerate(stage["envs"]):
            known_env(f"rollout.collector.stages[{i}].envs[{j}]", env)
    used = set(a.envs) | {e for s in a.stages for e in s["envs"]}
    for i, env in enumerate(a.eval_envs):
        known_env(f"rollout.collector.eval_envs[{i}]", env)
    for section in ("env_params", "server_urls"):
        for env in getattr(a, section):
            known_env(f"rollout.collector.{section}.{env}", env)
    for env, params in a.env_params.items():
        if env.startswith("agentgym:"):
            raise ConfigError(f"rollout.collector.env_params.{env}: an AgentGym server takes no parameters from credo "
                              f"(its contract: agent.remote.contract)")
        if not isinstance(params, dict):
            raise ConfigError(f"rollout.collector.env_params.{env}: expected a mapping of parameters, got {params!r}")
        wrap(f"rollout.collector.env_params.{env}", lambda: make_env(env, **params))
    for env, url in a.server_urls.items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"rollout.collector.server_urls.{env}: expected an http(s) URL, got {url!r}")
        if env not in used and env not in a.eval_envs:
            raise ConfigError(f"rollout.collector.server_urls.{env}: {env!r} is neither trained nor evaluated")
    for env in sorted(used | set(a.eval_envs)):
        if env.startswith("agentgym:") and env not in a.server_urls:
            raise ConfigError(f"{env}: an AgentGym environment needs its server's URL (agent.remote.url, or "
                              f"rollout.collector.server_urls.{env})")
    _check_task_spaces(cfg, a, used)
    _check_horizon_and_branching(a)


def _check_task_spaces(cfg, a: AgentCollectorConfig, used: set) -> None:
    """Environments with a bounded task set (``EnvSpec.task_space``: skyrl_gym:<id> over its dataset) resolve it
    now (a missing or empty dataset is a config error); environments without an oracle have no demonstrations
    for the SFT warm start."""
    from credo.envs import check_env_params, get_env_spec

    for env in sorted(used | set(a.eval_envs)):
        space = get_env_spec(env).task_space
        if space is not None:
            params = a.env_params.get(env, {})
            wrap(f"rollout.collector.env_params.{env}",
                 lambda: [space(check_env_params(env, params), split) for split in ("train", "eval")])
    no_oracle = sorted(e for e in used if not e.startswith(REMOTE_PREFIX) and get_env_spec(e).oracle is None)
    if no_oracle and warm_start_on(cfg) and cfg.warm_start.steps > 0:
        raise ConfigError(f"warm_start.steps: {', '.join(no_oracle)} has no oracle to imitate; set warm_start.steps=0 "
                          f"(or start from a model trained elsewhere: model.path)")


def known_env(key: str, name) -> str:
    """``name`` is a registered environment (``credo list envs``) or a name with a registered prefix
    (``credo.envs.base.PREFIXES``: an AgentGym adapter ``agentgym:<env>``, a skyrl-gym id ``skyrl_gym:<id>``)."""
    from credo.envs import get_env_spec, list_envs
    from credo.envs.base import PREFIXES

    list_envs()  # imports the built-in environment modules, which register the prefixes
    if isinstance(name, str) and name.startswith(tuple(PREFIXES.names())):
        wrap(key, lambda: get_env_spec(name))
        return name
    if not isinstance(name, str) or name not in list_envs():
        raise ConfigError(f"{key}: unknown environment {name!r}{did_you_mean(name, list_envs())}; environments: "
                          f"{', '.join(list_envs())}")
    return name


def _check_remote(cfg) -> None:
    """``rollout.collector.remote`` (``agent.remote``): a known adapter, an http(s) URL, id ranges, contract fields;
    no warm start from demonstrations (an AgentGym server has no oracle credo can call)."""
    r = cfg.rollout.collector.remote
    if r.env is None:
        for key in ("url", "train_ids", "eval_ids", "instruction"):
            if getattr(r, key) is not None:
                raise ConfigError(f"agent.remote.{key}: set agent.remote.env too (the AgentGym environment it serves)")
        return
    if not isinstance(r.url, str) or not r.url.startswith(("http://", "https://")):
        raise ConfigError(f"agent.remote.url: expected the http(s) URL of the {r.env} server, got {r.url!r}")
    for key in ("train_ids", "eval_ids"):
        value = getattr(r, key)
        if value is not None and not (isinstance(value, list) and len(value) == 2):
            raise ConfigError(f"agent.remote.{key}: expected [lo, hi), got {value!r}")
    a = cfg.rollout.collector
    wrap("agent.remote", lambda: remote_adapter(a, remote_name(a)))
    if warm_start_on(cfg) and cfg.warm_start.steps > 0:
        raise ConfigError("warm_start.steps: an AgentGym environment has no oracle to imitate; set "
                          "warm_start.steps=0 (or start from a model trained elsewhere: model.path)")


def _check_horizon_and_branching(a: AgentCollectorConfig) -> None:
    """The agent collector's horizon schedule and branching arguments."""
    from credo.rollout.branching import AEPO_DEFAULTS, ARPO_DEFAULTS

    if a.horizon_schedule == "stepwise":
        if not a.horizon_rounds or not all(isinstance(h, int) and h >= 1 for h in a.horizon_rounds):
            raise ConfigError(f"rollout.collector.horizon_rounds: stepwise needs a non-empty list of turn caps >= 1, "
                              f"got {a.horizon_rounds!r}")
    elif a.horizon_rounds:
        raise ConfigError("rollout.collector.horizon_rounds: only used with rollout.collector.horizon_schedule=stepwise")
    if a.branching == "none" and a.branch_args:
        raise ConfigError("rollout.collector.branch_args: only used with rollout.collector.branching=arpo or aepo")
    if a.branching != "none":
        known = ARPO_DEFAULTS if a.branching == "arpo" else AEPO_DEFAULTS
        for key in a.branch_args:
            if key not in known:
                raise ConfigError(f"rollout.collector.branch_args.{key}: {a.branching} has no parameter {key!r}"
                                  f"{did_you_mean(key, known)}; it takes: {', '.join(known)}")


# ----------------------------------------------------------------------------- the gateway collector

AGENT_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@register_validator("rollout.collector.gateway")
def validate_gateway(cfg) -> None:
    """The gateway collector (``rollout.collector``, ``type: gateway``): one agent (a ``module:function`` callable,
    a command line, or a verifiers environment), a verifier where one scores, no demonstrations to warm start
    from with a verifiers environment."""
    g = cfg.rollout.collector
    if g.type != "gateway":
        return
    given = [k for k in ("agent", "command", "verifiers") if getattr(g, k) is not None]
    if len(given) != 1:
        raise ConfigError("rollout.collector: set exactly one of agent (pkg.module:function), command ('python "
                          f"my_agent.py') and verifiers ({{env: ..., args: {{}}}}); got {given or 'none'}")
    if g.agent is not None and not (isinstance(g.agent, str) and AGENT_SPEC.match(g.agent)):
        raise ConfigError(f"rollout.collector.agent: expected pkg.module:function, got {g.agent!r}")
    if g.command is not None:
        try:
            argv = shlex.split(g.command) if isinstance(g.command, str) else []
        except ValueError as exc:
            raise ConfigError(f"rollout.collector.command: {exc} in {g.command!r}") from None
        if not argv:
            raise ConfigError(f"rollout.collector.command: expected a command line, e.g. 'python my_agent.py', "
                              f"got {g.command!r}")
    if g.verifiers is not None:
        v = g.verifiers
        if not isinstance(v, dict) or not isinstance(v.get("env"), str) or not v["env"] \
                or not isinstance(v.get("args") or {}, dict):
            raise ConfigError(f"rollout.collector.verifiers: expected {{env: <module, package or hub id>, args: "
                              f"{{...}}, ...}} (credo.gateway.verifiers_env), got {v!r}")
        if warm_start_on(cfg) and cfg.warm_start.steps > 0:
            raise ConfigError("warm_start.steps: a verifiers environment brings no demonstrations to imitate; set "
                              "warm_start.steps=0 (or start from a model trained elsewhere: model.path)")
        if g.reward_from == "verifier" and cfg.reward.name is None:
            raise ConfigError("rollout.collector.reward_from=verifier: a verifiers environment's rows have no task "
                              "verifier; name one with reward.name, or keep reward_from=agent (its rubric)")
    if cfg.task.chat_template:
        raise ConfigError("task.chat_template: the gateway renders the agent's messages with the chat template "
                          "itself; a prompt already wrapped in it would be wrapped twice (set it to false)")
    if cfg.distributed.backend == "ray":
        raise ConfigError("rollout.collector.type=gateway: not implemented with distributed.backend=ray (the "
                          "gateway serves the in-process engine)")
