"""The built-in collectors' builders: ``group`` (single-turn groups), ``agent`` (multi-turn episodes) and
``gateway`` (the user's own agent against credo's OpenAI-compatible gateway), with the task rows and held-out
evaluation of the last two."""
from __future__ import annotations

from credo.collect.agent import AgentCollector, AgentOptions
from credo.collect.base import Collector
from credo.collect.group import GroupCollector, GroupOptions
from credo.collect.registry import COLLECTOR_DATA, COLLECTOR_EVALS, COLLECTORS, CollectorInputs
from credo.data import PromptSampler
from credo.types import SamplingParams


@COLLECTORS.register("group")
def _group(x: CollectorInputs) -> Collector:
    return GroupCollector(x.engine, x.runner_for, x.sampler, SamplingParams.of(x.cfg.rollout), GroupOptions.of(x.cfg))


@COLLECTORS.register("agent")
def _agent(x: CollectorInputs) -> Collector:
    stage_samplers = [PromptSampler(exs, seed=x.cfg.seed + i) for i, exs in enumerate(x.data.stage_train)]
    return AgentCollector(AgentOptions.of(x.cfg), x.engine, x.tokenizer, x.sampler, stage_samplers,
                          SamplingParams.of(x.cfg.rollout), guards=x.guards)


@COLLECTOR_DATA.register("agent")
def _agent_data(cfg, seed: int):
    """Environment tasks (credo.collect.agent.agent_task_data)."""
    from credo.collect.agent import agent_task_data

    return agent_task_data(AgentOptions.of(cfg), seed)


@COLLECTOR_EVALS.register("agent")
def _agent_eval(cfg, engine, runner, examples, *, seed: int, samples_path=None) -> dict:
    """Greedy and sampled episodes against the environments (credo.collect.agent.evaluate_agent)."""
    from credo.collect.agent import evaluate_agent

    return evaluate_agent(AgentOptions.of(cfg), engine, engine.tokenizer, examples, seed=seed,
                          samples_path=samples_path)


@COLLECTORS.register("gateway")
def _gateway(x: CollectorInputs) -> Collector:
    from credo.collect.gateway import build_gateway_collector

    return build_gateway_collector(x)


@COLLECTOR_DATA.register("gateway")
def _gateway_data(cfg, seed: int):
    """``task.*``'s rows, or a verifiers environment's own (credo.collect.gateway.gateway_task_data)."""
    from credo.collect.gateway import gateway_task_data

    return gateway_task_data(cfg, seed)


@COLLECTOR_EVALS.register("gateway")
def _gateway_eval(cfg, engine, runner, examples, *, seed: int, samples_path=None) -> dict:
    """The agent's episodes on the held-out rows (credo.collect.gateway.evaluate_gateway)."""
    from credo.collect.gateway import evaluate_gateway

    return evaluate_gateway(cfg, engine, runner, examples, seed=seed, samples_path=samples_path)
