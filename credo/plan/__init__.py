"""``credo plan``: a cost model of memory per rank and FLOPs per RL step (:mod:`.model`, pure functions) and
its command (:mod:`.cli`); docs/plan.md."""
