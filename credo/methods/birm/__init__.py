"""BiRM (docs/reward_models.md, BiRM): a bidirectional process reward model. ``algo``: targets, loss, score (pure
math); ``model``: the two-headed model; ``train``: step labels and training; ``search``: best-of-N and beam search;
``recipe``: ``credo rm train rm.method=birm``; ``config``: the ``birm`` section."""
