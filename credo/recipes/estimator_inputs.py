"""The advantage estimator's optional inputs: input name -> a provider, registered by whoever can provide it.

An estimator declares the inputs it reads (``register_advantage(..., needs=(...))``); the step asks this table for
each and nothing else. Built-ins here read the batch, the old-log-prob pass's statistics, the run state or the
rollouts; a method whose estimator reads a new input registers its provider (AttnRL's ``tree_paths``, in its
collector module, named below as a built-in)::

    ESTIMATOR_INPUTS.add("my_input", lambda x: ...)      # x: InputContext
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from credo.algo import advantage_accepts
from credo.algo.rollout_correction import rollout_is_weights
from credo.registry import Registry
from credo.tracking.timer import Timer
from credo.train.forward import VALUE_QUANTILES
from credo.train.update import rollout_correction_mode
from credo.types import SamplingParams, TrainBatch


@dataclass(frozen=True)
class InputContext:
    """What an estimator input's provider may read."""

    cfg: Any
    parts: Any
    batch: TrainBatch
    rollouts: Any
    token_stats: dict[str, torch.Tensor]
    state: Any
    timer: Timer


ESTIMATOR_INPUTS: Registry[Callable[[InputContext], Any]] = Registry(
    "estimator input", builtins=("credo.methods.attnrl.collector",))
ESTIMATOR_INPUTS.add("values", lambda x: x.batch.values)
ESTIMATOR_INPUTS.add("value_quantiles", lambda x: x.batch.extras.get(VALUE_QUANTILES))
ESTIMATOR_INPUTS.add("entropy_direction", lambda x: x.token_stats["entropy_direction"])
ESTIMATOR_INPUTS.add("sum_pi_squared", lambda x: x.token_stats["sum_pi_squared"])
ESTIMATOR_INPUTS.add("old_logprobs", lambda x: x.batch.old_logprobs)
ESTIMATOR_INPUTS.add("entropy_history", lambda x: list(x.state.entropy_history))


@ESTIMATOR_INPUTS.register("reward_components")
def reward_components(x: InputContext) -> dict[str, torch.Tensor]:
    """name -> (B,) score of each reward component every row's result names (``info["components"]``: the
    ``reward.mix`` components, or the extra numeric keys of a verifier that returns a dict), in the first row's
    order; {} when some row has none."""
    comps = [r.info.get("components") or {} for r in x.rollouts.results]
    names = [n for n in (comps[0] if comps else {}) if all(n in c for c in comps)]
    return {n: torch.tensor([float(c[n]) for c in comps]) for n in names}


@ESTIMATOR_INPUTS.register("reward_baselines")
def greedy_baselines(x: InputContext) -> torch.Tensor:
    """ReMax baseline: the score of one greedy response per prompt, repeated over the prompt's samples (generated
    and scored by the leader's engine and runner)."""
    rollout, trajs = x.parts.rollout, x.rollouts.trajs
    first = {}
    for t in trajs:
        first.setdefault(t.group_id, t.example)

    def leader() -> list[float]:
        rollout.idle()  # one engine call at a time
        greedy = rollout.engine.generate(list(first.values()), 1, SamplingParams(
            greedy=True, max_new_tokens=x.cfg.rollout.max_new_tokens))
        return [r.score for r in rollout.runner.score([g.response_text for g in greedy], [g.example for g in greedy])]

    with x.timer("gen_baseline"):
        scores = rollout.leader(leader)
    by_group = dict(zip(first, scores))
    return torch.tensor([by_group[t.group_id] for t in trajs], dtype=torch.float32)


def rollout_weights(cfg, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """{"rollout_is_weights": (B, T)} for an estimator that accepts them (the Optimal Token Baseline scales its
    energy by w^2), when ``algo.rollout_correction`` is on and the old-log-prob pass ran; {} otherwise."""
    mode = rollout_correction_mode(cfg)
    if "rollout_is_weights" not in advantage_accepts(cfg.algo.advantage) or mode == "none" \
            or batch.old_logprobs is None:
        return {}
    weights, _ = rollout_is_weights(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask, mode=mode,
                                    low=cfg.algo.rollout_is_low, high=cfg.algo.rollout_is_high)
    return {"rollout_is_weights": weights}


def estimator_inputs(x: InputContext, names: tuple[str, ...]) -> dict[str, Any]:
    """The inputs ``names`` the estimator declares, and the rollout-correction weights when it accepts them."""
    return {name: ESTIMATOR_INPUTS.get(name)(x) for name in names} | rollout_weights(x.cfg, x.batch)
