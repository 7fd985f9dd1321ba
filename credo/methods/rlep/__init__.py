"""RLEP (docs/algorithms/rlep.md): experience replay. ``pool``: the pool of verified answers and its mixing into
groups; ``collector``: the replay-wrapping collector; ``recipe``: ``credo rlep collect``; ``config``: the ``replay``
section."""
