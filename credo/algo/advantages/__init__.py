"""Advantage estimators, registered by name (importing this package registers all of them).

- group outcome baselines: ``grpo``, ``dr_grpo``, ``rloo``, ``opo``, ``grpo_passk``,
  ``reinforce_pp_baseline`` (:mod:`.outcome`)
- returns: ``gae`` (critic), ``reinforce_pp``, ``remax`` (:mod:`.returns`)
- ``evpo`` (explained-variance gate between critic and group baseline, :mod:`.evpo`)
- ``papo`` (entropy-polarity reweighting, :mod:`.papo`)
- ``optimal_token_baseline``, ``tir_optimal_token_baseline`` (energy-weighted per-token group baseline, :mod:`.otb`)
- ``gdpo`` (per-component group normalisation, weighted sum, batch whitening, :mod:`.gdpo`)

A method package's own estimator registers from its package, named among the registry's built-ins
(``attnrl``: :mod:`credo.methods.attnrl.advantage`; ``dvpo``: :mod:`credo.methods.dvpo.advantage`; ``dfpo``:
:mod:`credo.methods.dfpo.advantage`).
"""
from credo.algo.advantages import evpo, gdpo, otb, outcome, papo, returns  # noqa: F401 (registry)
from credo.algo.advantages.common import (
    broadcast,
    explained_variance,
    group_stats,
    masked_whiten,
    sequence_scores,
    token_rewards,
)
from credo.algo.advantages.papo import papo_phase
from credo.algo.advantages.returns import discounted_returns, gae

__all__ = ["broadcast", "discounted_returns", "explained_variance", "gae", "group_stats", "masked_whiten",
           "papo_phase", "sequence_scores", "token_rewards"]
