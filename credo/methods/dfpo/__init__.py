"""DFPO (docs/algorithms/dfpo.md): a value-flow critic. ``flow_head``: the ``flow`` critic head; ``advantage``: the
``dfpo`` estimator; ``critic``: the ``dfpo`` critic loss. Its math is :mod:`credo.algo.dfpo`; the flow target pass
is the trainer's (:mod:`credo.train.flow_targets`)."""
