"""Verifiable rewards: a registry of verifiers and a fault-tolerant batch runner.

    from credo.rewards import RewardRunner
    with RewardRunner("countdown", timeout_s=5.0) as runner:
        results = runner.score(responses, examples)   # list[RewardResult], order preserved

Built-in verifiers (registered on import): ``exact_match``, ``countdown``, ``math``. Custom ones
are registered with :func:`register_reward` or referenced as ``"package.module:function"``.
Nothing here imports torch, so reward worker processes start fast.
"""
from credo.rewards import verifiers  # noqa: F401  (registers the built-ins)
from credo.rewards.registry import get_reward_fn, list_rewards, register_reward, to_result
from credo.rewards.runner import RewardRunner

__all__ = ["RewardRunner", "get_reward_fn", "list_rewards", "register_reward", "to_result"]
