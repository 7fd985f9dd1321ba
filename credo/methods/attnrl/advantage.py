"""Tree segment advantages (AttnRL / TreeRL, docs/algorithms/attnrl.md): the advantage estimator ``attnrl``,
registered into :data:`credo.algo.registry.ADVANTAGE_ESTIMATORS` (which names this module among its built-ins).

Each training row is a root-to-leaf path of a rollout tree (:class:`credo.methods.attnrl.algo.TreePath`, built by
``credo.methods.attnrl.collector``); every token of a node's segment gets

    A_seg = ((V_node - V_root) + (V_node - V_parent)) / sqrt(#leaves under node),

with V the mean leaf reward of a subtree and V_root the mean over all the problem's leaves (also the leaves that
are not trained on). The advantages are passed through without further normalisation (verl ``adv_estimator=attnrl``
returns ``token_level_rewards * response_mask``).
"""
from __future__ import annotations

import torch

from credo.algo.registry import register_advantage
from credo.methods.attnrl.algo import TreePath, path_token_advantages, tree_advantages
from credo.types import AdvantageOutput


@register_advantage("attnrl", needs=("tree_paths",))
def attnrl_advantage(
    *,
    response_mask: torch.Tensor,  # (B, T)
    tree_paths: list[TreePath],  # (B,) each row's path in its problem's tree
) -> AdvantageOutput:
    """AttnRL / TreeRL: A_seg = ((V - V_root) + (V - V_parent)) / sqrt(leaves) per segment; no normalisation.

    See docs/algorithms/attnrl.md.
    """
    if len(tree_paths) != response_mask.shape[0]:
        raise ValueError(f"attnrl: {len(tree_paths)} tree paths for {response_mask.shape[0]} rows")
    by_tree: dict[int, list[float]] = {}  # id(tree) -> advantage of every node
    rows = []
    for path in tree_paths:
        key = id(path.tree)
        if key not in by_tree:
            by_tree[key] = tree_advantages(path.tree.parents, path.tree.leaf_rewards)
        rows.append(path_token_advantages(by_tree[key], path, response_mask.shape[1]))
    adv = (torch.stack(rows) if rows else torch.zeros_like(response_mask)) * response_mask  # (B, T)
    zero_rows = float(((adv != 0).sum(-1) == 0).float().mean()) if len(rows) else 0.0
    metrics = {"attnrl/trees": float(len(by_tree)), "attnrl/zero_adv_rows": zero_rows}
    return AdvantageOutput(advantages=adv, returns=adv, metrics=metrics)
