"""Multi-turn environments for agent RL: the protocol, built-ins, HTTP server and clients.

``credo.envs.list_envs()`` names the registered environments (built-ins: ``calc``, ``maze``, ``wordle``,
``toolgraph``, ``verify``, and the structured-tools ``calc_tools`` and ``toolgraph_tools``); AgentGym servers are reached as ``agentgym:<env>``,
skyrl-gym environments over a dataset of SkyRL rows as ``skyrl_gym:<id>`` (credo.envs.skyrl).
"""
from credo.envs.base import (
    ENVS,
    EVAL_OFFSET,
    ActionParser,
    Env,
    EnvSpec,
    StepResult,
    check_env_params,
    eval_task_ids,
    get_env_spec,
    list_envs,
    make_env,
    register_env,
    train_task_ids,
)
from credo.envs.client import EnvClient, EnvError, HTTPEnvClient, LocalEnvClient

__all__ = ["ENVS", "EVAL_OFFSET", "ActionParser", "Env", "EnvClient", "EnvError", "EnvSpec", "HTTPEnvClient",
           "LocalEnvClient", "StepResult", "check_env_params", "eval_task_ids", "get_env_spec", "list_envs", "make_env",
           "register_env", "train_task_ids"]
