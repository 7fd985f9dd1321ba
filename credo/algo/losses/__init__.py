"""Per-token policy losses, registered by name (importing this package registers all of them).

Each loss returns the per-token loss ``L_it`` to minimise plus per-token region indicators;
:func:`credo.algo.compute_policy_loss` aggregates. Sign convention: ``dL/dlogprob = -A * w`` with ``w`` the
region's gradient weight (docs/algorithms/README.md#notation-and-sign-convention).

- ``ppo`` (PPO-clip, clip-higher, dual-clip), ``gpg``: :mod:`.ppo`
- ``gppo``, ``cegppo`` (gradient-preserving clipping): :mod:`.gppo`
- ``aspo``, ``archer`` (entropy-split clipping and KL): :mod:`.entropy_split`
- ``gspo``, ``gmpo``, ``sapo``, ``cispo`` (sequence ratios, soft gates, clipped IS weights): :mod:`.sequence`
- ``clip_cov``, ``kl_cov`` (covariance-based token selection): :mod:`.cov`
- ``dppo_tv``, ``dppo_kl`` (divergence trust-region masks, truncated IS weight): :mod:`.dppo`
- ``dro``, ``bypass_mode`` (log-prob losses; verl's bypass mode against the sampler's log-probs): :mod:`.reinforce`
"""
from credo.algo.losses import cov, entropy_split, gppo, ppo, sequence  # noqa: F401  (registration)
from credo.algo.losses import dppo  # noqa: F401  (registration)
from credo.algo.losses import reinforce  # noqa: F401  (registration)
from credo.algo.losses.common import LOG_RATIO_CLAMP, log_ratio

__all__ = ["LOG_RATIO_CLAMP", "log_ratio"]
