"""The built-in collectors' builders: ``group`` (single-turn groups) and ``agent`` (multi-turn episodes)."""
from __future__ import annotations

from credo.collect.agent import AgentCollector, AgentOptions
from credo.collect.base import Collector
from credo.collect.group import GroupCollector, GroupOptions
from credo.collect.registry import COLLECTORS, CollectorInputs
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
