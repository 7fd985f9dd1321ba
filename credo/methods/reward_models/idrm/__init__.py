"""Interaction Distillation for reward models (ID-RM, docs/reward_models.md, [derived]): a bidirectional
cross-encoder teacher whose attention the Bradley-Terry student aligns to. ``algo``: block renormalisation, the
alignment losses and virtual cross-attention (pure math); ``teacher``: the cross-encoder and its training;
``student``: eager attention maps and q / k captured by hooks; ``train``: the alignment terms and the training loop;
``recipe``: ``credo rm train rm.method=idrm``; ``config``: the ``idrm`` section."""
