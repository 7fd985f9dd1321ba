"""Rollout: the :class:`RolloutEngine` protocol and its Hugging Face implementation."""
from credo.rollout.base import RolloutEngine
from credo.rollout.hf import HFRolloutEngine, filter_logits

__all__ = ["HFRolloutEngine", "RolloutEngine", "filter_logits"]
