"""Training recipes: each reads top to bottom (``rlvr``: RL with verifiable rewards; ``sft``)."""
