"""DVPO (docs/algorithms/dvpo.md): a distributional critic. ``advantage``: the ``dvpo`` estimator (distributional
GAE over the quantiles); ``critic``: the ``dvpo`` critic loss. Its math (quantile regression, tail terms,
distributional GAE) is :mod:`credo.algo.dvpo`, which DFPO shares; the ``quantile`` head is generic
(:mod:`credo.models.value`)."""
