"""The ``rollout.collector`` section of ``type: agent``: multi-turn agent episodes, rewards from environments
(was the ``agent`` section)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from credo.config.fields import opt, type_key


@dataclass
class RemoteEnvConfig:
    """An AgentGym environment server trained on with no user code (also reachable as ``agent.remote.*``)."""

    env: str | None = opt(None, "AgentGym environment of the adapter table (credo env list): textcraft, babyai, "
                          "maze, wordle, alfworld, webshop, sqlgym, or one a plugin registered; trained as "
                          "agentgym:<env>; null = none")
    url: str | None = opt(None, "base URL of its server, e.g. http://127.0.0.1:36001")
    train_ids: list | None = opt(None, "[lo, hi): training task ids drawn from this range (null = the adapter's)")
    eval_ids: list | None = opt(None, "[lo, hi): held-out task ids, in order (null = the adapter's)")
    instruction: str | None = opt(None, "what the agent is told before the first observation (null = the adapter's)")
    contract: dict = opt(None, "adapter fields to override: prefix, id_field, reset_field, reset_extra, create_body, "
                         "action (line|after|react|sql), first_observation, reset_text, observation_field, "
                         "reward_field, done_field, reward (last|sum), success (reward|done) (docs/agents.md)",
                         factory=dict)


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
    horizon_rounds: list = opt(None, "stepwise horizons, e.g. [2, 4, 6]", factory=list)
    horizon_period: int = opt(100, "steps per stepwise horizon stage", min=1)
    eval_max_turns: int | None = opt(None, "turn cap at evaluation (null = the largest training horizon)", min=1)
    max_tokens_per_turn: int = opt(24, "generated tokens per assistant turn", min=1)
    max_response_tokens: int = opt(256, "token budget of a whole episode after the prompt", min=8)
    threads: int = opt(8, "concurrent environment steps", min=1)
    kv_reuse: bool = opt(True, "keep each episode's KV cache across turns, so a turn prefills only its new tokens "
                         "(HF engine, Llama-family models; vLLM reuses through its prefix cache); false re-prefills "
                         "the history every turn")
    timeout_s: float = opt(30.0, "whole-call deadline of each HTTP environment request (connect to the reply's "
                           "last byte; a reply is capped at 8 MiB)", min=0.01)
    retries: int = opt(2, "retries of idempotent HTTP environment calls", min=0)
    max_env_failure_share: float = opt(0.5, "stop the run when more than this share of a training step's episodes "
                                       "failed in the environment (server error, timeout, bad answer); such episodes "
                                       "are never trained on (1 = never stop)", min=0.0, max=1.0)
    reward_placement: str = opt("last_action", "outcome reward on the last action token (credo) or the last "
                                "response token (AgentGym-RL reference)", choices=("last_action", "last_token"))
    template: str = opt("auto", "turn template: plain (credo's character models), chat (tokenizer's chat "
                        "template) or auto", choices=("auto", "plain", "chat"))
    branching: str = opt("none", "branching rollouts: none, arpo or aepo", choices=("none", "arpo", "aepo"))
    branch_args: dict = opt(None, "branching hyperparameters (docs/agents.md)", factory=dict)
    stop_at_action: bool = opt(False, "end each assistant turn at the closing tag of its action (e.g. </move>), as "
                               "ARPO stops at </python>; default: the model ends turns with its end-of-turn token")
    turn_cost: float = opt(0.0, "training reward shaping: subtracted per assistant turn (0 = the env's outcome "
                           "reward only, as AgentGym-RL)", min=0.0)
    invalid_action_cost: float = opt(0.0, "training reward shaping: subtracted per turn without a parseable action",
                                     min=0.0)
    tools: ToolsConfig = opt(None, "structured tool calling: the call parser and chat template (tools "
                             "environments only)", factory=ToolsConfig)


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
