"""Outcome reward models: Bradley-Terry ORMs and CRM's peer-reviewing pair. ``algo``: losses and peer selection
(pure math); ``pairs``: preference data; ``train``: training loops; ``recipe``: ``credo rm train``; ``config``: the
``rm`` section and the config root of ``credo rm train``; ``idrm``: Interaction Distillation, a Bradley-Terry
student built on these pieces (``rm.method=idrm``). Scoring with a trained model as a reward lives in
:mod:`credo.rewards.reward_model`."""
