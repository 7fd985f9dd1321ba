"""AttnRL (docs/algorithms/attnrl.md): attention-guided tree rollouts. ``algo``: FCI, branch points, TreeRL
segment advantages (pure math); ``advantage``: the ``attnrl`` advantage estimator; ``fci``: the attention pass;
``collector``: the tree collector; ``config``: the ``rollout.collector`` section of ``type: tree``."""
