"""AttnRL: attention-guided branching and TreeRL segment advantages (docs/algorithms/attnrl.md), pure math.

Reference: ``RyanLiu112/AttnRL`` @378c38e (``recipe/attnrl/attnrl_core_algos.py::TreeWorker``,
``recipe/modeling_qwen2.py``, ``verl/trainer/ppo/ray_trainer.py::attention_preprocess``).

Numbering: a sequence is split into steps ``0 .. K-1``; step 0 is the prompt, steps ``1 ..`` are the response's
steps. :func:`segment_steps` returns the response's steps only (index 0 there = step 1 of the sequence).

- **Steps**: a response is cut after every token whose decoded string contains ``"\\n\\n"`` (fallback ``"\\n"``,
  fallback every token); ``step_tokens = k > 0`` cuts fixed chunks of k tokens instead (credo's character tasks have
  no newlines).
- **FCI**: alpha^{j,k} = mean over the query tokens of step j and the key tokens of step k of the attention
  weights; y^k_{l,h} = sum_{j >= k + Delta} alpha^{j,k}; y^k = max_{l,h} y^k_{l,h}; steps 0 and 1 score 0, and so
  do the step holding the end-of-thinking marker and every later step.
- **Branch points**: candidates are the response steps with y >= the q-quantile of the response's scores (the
  first response step excluded); the earliest N candidates in index order whose start lies at position >=
  ``min_position`` (prompt + response tokens) and whose span is >= ``min_gap`` tokens away from every chosen
  step's span; fewer than N: sequential steps, then repeats.
- **Adaptive counts**: with a = accuracy of the n initial samples, ceil(n e^{(1-a)-1}) responses are branched;
  mixed problems branch every minority-outcome response and top up at random from the majority.
- **Tree advantages** (TreeRL): V(node) = mean leaf reward of its subtree, V(root) = mean over all leaves,
  A = ((V - V_root) + (V - V_parent)) / sqrt(#leaves under node), on every token of the node's segment.
- **Dynamic batch size**: B <- ceil(beta floor(B target / EMA(valid)) + (1 - beta) B).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from credo.train.state_codec import register_state_type

Span = tuple[int, int]  # [start, end) token offsets


# ----------------------------------------------------------------------------- steps

def segment_steps(token_texts: Sequence[str], *, step_tokens: int = 0,
                  separators: tuple[str, ...] = ("\n\n", "\n")) -> list[Span]:
    """The response's steps as [start, end) token spans covering it (``attention_preprocess``).

    ``step_tokens = 0``: a step ends after each token whose decoded text contains the first separator that occurs
    in the response at all (``"\\n\\n"``, else ``"\\n"``), else every token is a step. ``step_tokens = k``:
    consecutive chunks of k tokens.
    """
    n = len(token_texts)
    if n == 0:
        return []
    if step_tokens > 0:
        return [(s, min(s + step_tokens, n)) for s in range(0, n, step_tokens)]
    ends: list[int] = []
    for sep in separators:
        ends = [i + 1 for i, text in enumerate(token_texts) if sep in text]
        if ends:
            break
    if not ends:
        ends = list(range(1, n + 1))  # every token is a step
    if ends[-1] != n:
        ends.append(n)
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


# ----------------------------------------------------------------------------- FCI

def step_weights(spans: Sequence[Span], seq_len: int) -> torch.Tensor:
    """(K, S): row k is 1 / |step k| on the tokens of step k, 0 elsewhere."""
    w = torch.zeros(len(spans), seq_len)
    for k, (s, e) in enumerate(spans):
        if e > s:
            w[k, s:e] = 1.0 / (e - s)
    return w


def step_attention(attn: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """alpha^{j,k} = sum_{s,t} W[j,s] A[s,t] W[k,t]: mean attention from the tokens of step j to those of step k.

    ``attn`` (..., S, S) token attention (query rows, key columns); ``weights`` (K, S) or broadcastable
    (..., K, S). Returns (..., K, K), query step first.
    """
    w = weights.to(attn.dtype)
    return w @ attn @ w.transpose(-1, -2)  # (..., K, K)


def fci_from_step_attention(alpha: torch.Tensor, *, ignore: int = 4, stop_step: int | None = None) -> torch.Tensor:
    """y^k = sum_{j >= k + ignore} alpha^{j,k} (NaNs as 0), with y^0 = y^1 = 0 and y^k = 0 for k >= stop_step
    when ``stop_step > 0``. ``alpha`` (..., K, K) -> (..., K)."""
    k = alpha.shape[-1]
    j_idx = torch.arange(k).unsqueeze(-1)  # (K, 1) query steps
    k_idx = torch.arange(k).unsqueeze(0)  # (1, K) key steps
    later = (j_idx >= k_idx + ignore).to(alpha.dtype)  # (K, K)
    y = torch.nan_to_num(alpha * later).sum(-2)  # (..., K)
    y[..., :2] = 0.0
    if stop_step is not None and stop_step > 0:
        y[..., stop_step:] = 0.0
    return y


def fci_scores(attn: torch.Tensor, spans: Sequence[Span], *, ignore: int = 4,
               stop_step: int | None = None) -> torch.Tensor:
    """FCI score of every step: ``attn`` (L, H, S, S) the attention of every layer and head of one sequence,
    ``spans`` its K steps in sequence coordinates (step 0 = the prompt). Returns (K,): max over layers and heads
    of :func:`fci_from_step_attention`."""
    alpha = step_attention(attn, step_weights(spans, attn.shape[-1]))  # (L, H, K, K)
    y = fci_from_step_attention(alpha, ignore=ignore, stop_step=stop_step)  # (L, H, K)
    return y.flatten(0, -2).max(0).values  # (K,)


# ----------------------------------------------------------------------------- branch points

def branch_points(scores: Sequence[float] | torch.Tensor, spans: Sequence[Span], *, num: int = 2,
                  quantile: float = 0.8, min_position: int = 512, min_gap: int = 512, offset: int = 0) -> list[int]:
    """Token offsets (response coordinates) of up to ``num`` branch points (``find_top_k_token_idxs``).

    ``scores`` (K,) and ``spans`` (K,) are the response's steps (index 0 = its first step, never a candidate).
    Threshold = the ``quantile`` of ``scores`` (linear interpolation; if it is 0 while some score is positive, the
    smallest positive score). Candidates >= threshold are taken in index order when ``offset + start >=
    min_position`` (``offset`` = prompt tokens: the reference measures positions in the whole sequence) and the
    gap between their span and every chosen span is >= ``min_gap`` tokens. Short of ``num``: the steps 1, 2, ...
    not yet chosen, then repeats of them. A one-step response has no branch point.
    """
    s = torch.as_tensor(scores, dtype=torch.float64)
    if s.numel() < 2 or num <= 0:
        return []
    threshold = float(torch.quantile(s, quantile))
    if threshold == 0 and bool((s > 0).any()):
        threshold = float(s[s > 0].min())
    chosen: list[int] = []  # step indices
    for k in range(1, len(spans)):
        if float(s[k]) >= threshold and _far_enough(k, chosen, spans, min_position, min_gap, offset):
            chosen.append(k)
            if len(chosen) == num:
                return [spans[c][0] for c in chosen]
    out = [spans[c][0] for c in chosen]
    for k in range(1, len(spans)):  # sequential fallback, no distance check
        if len(out) == num:
            return out
        if spans[k][0] not in out:
            out.append(spans[k][0])
    while len(out) < num:  # fewer steps than points: repeat them
        out += [spans[k][0] for k in range(1, len(spans))][: num - len(out)]
    return out


def _far_enough(k: int, chosen: list[int], spans: Sequence[Span], min_position: int, min_gap: int,
                offset: int) -> bool:
    start, end = spans[k]
    if offset + start < min_position:
        return False
    for c in chosen:
        c_start, c_end = spans[c]
        if c_start >= end and c_start - end < min_gap:
            return False
        if start >= c_end and start - c_end < min_gap:
            return False
    return True


# ----------------------------------------------------------------------------- adaptive sampling

def branch_budget(correct: int, n: int, *, mode: str = "exp") -> int:
    """Responses of a problem to branch: ceil(n exp((1 - a) - 1)) with a = correct / n (3 of 6 at a = 1, 6 at
    a = 0); ``mode="uniform"``: n."""
    if mode == "uniform":
        return n
    a = correct / n
    return math.ceil(n * math.exp((1 - a) - 1))


def select_responses(correct: Sequence[bool], budget: int, generator: torch.Generator) -> list[int]:
    """Indices of the responses to branch, sorted. All correct or all wrong: the first ``budget``. Mixed: every
    response of the minority outcome (the incorrect ones when accuracy >= 0.5, else the correct ones), topped up to
    ``budget`` by a uniform draw without replacement from the majority."""
    n = len(correct)
    right = [i for i, c in enumerate(correct) if c]
    wrong = [i for i, c in enumerate(correct) if not c]
    if not right or not wrong:
        return list(range(min(budget, n)))
    minority, majority = (wrong, right) if len(right) / n >= 0.5 else (right, wrong)
    extra = max(0, min(budget - len(minority), len(majority)))
    order = torch.randperm(len(majority), generator=generator)[:extra].tolist()
    return sorted(minority + [majority[i] for i in order])


def running_mean(mean: float | None, count: int, values: Sequence[float]) -> tuple[float | None, int]:
    """Count-weighted running mean over every value seen (the reference ``RunningAverage(alpha=0)``)."""
    if not values:
        return mean, count
    batch = sum(values) / len(values)
    if count == 0 or mean is None:
        return batch, len(values)
    total = count + len(values)
    return (mean * count + batch * len(values)) / total, total


# ----------------------------------------------------------------------------- dynamic batch size

def ema(previous: float | None, value: float, alpha: float) -> float:
    """EMA with the first value taken as is (``RunningAverage(alpha)``; alpha = 1 keeps the latest value)."""
    return value if previous is None else alpha * value + (1 - alpha) * previous


def next_batch_size(batch: int, valid_ema: float, *, target: float, beta: float = 0.1) -> int:
    """B' = ceil(beta floor(B target / EMA(valid)) + (1 - beta) B) (``_batch_sampler``; EMA(valid) >= 1)."""
    goal = (batch * target) // max(valid_ema, 1.0)
    return max(1, math.ceil(beta * goal + (1 - beta) * batch))


# ----------------------------------------------------------------------------- trees and advantages

@dataclass
class Tree:
    """One problem's rollout tree. Node 0 is the root (the prompt); ``parents[i]`` is node i's parent (-1 for the
    root); ``leaf_rewards`` maps every leaf (a complete response) to its reward."""

    parents: list[int] = field(default_factory=lambda: [-1])
    leaf_rewards: dict[int, float] = field(default_factory=dict)

    def add(self, parent: int) -> int:
        self.parents.append(parent)
        return len(self.parents) - 1


@dataclass
class TreePath:
    """A root-to-leaf path trained as one sequence: its nodes (root excluded) and each node's token span in the
    response's coordinates; consecutive spans tile the response."""

    tree: Tree
    nodes: tuple[int, ...]
    spans: tuple[Span, ...]


register_state_type(Tree, TreePath)  # pending tree rollouts are checkpointed with their trees


def tree_values(parents: Sequence[int], leaf_rewards: dict[int, float]) -> tuple[list[float], list[int]]:
    """(V, leaves): V(node) = mean reward of the leaves in its subtree, leaves(node) = their number (0: no leaf
    below, V = 0)."""
    total = [0.0] * len(parents)
    count = [0] * len(parents)
    for leaf, reward in leaf_rewards.items():
        node = leaf
        while node >= 0:
            total[node] += reward
            count[node] += 1
            node = parents[node]
    return [t / c if c else 0.0 for t, c in zip(total, count)], count


def tree_advantages(parents: Sequence[int], leaf_rewards: dict[int, float]) -> list[float]:
    """A(node) = ((V(node) - V(root)) + (V(node) - V(parent))) / sqrt(leaves(node)) (``path_from_root_to_node``);
    the root and leafless nodes get 0."""
    values, leaves = tree_values(parents, leaf_rewards)
    root = parents.index(-1)
    out = [0.0] * len(parents)
    for node, parent in enumerate(parents):
        if parent < 0 or leaves[node] == 0:
            continue
        out[node] = ((values[node] - values[root]) + (values[node] - values[parent])) / math.sqrt(leaves[node])
    return out


def path_token_advantages(node_adv: Sequence[float], path: TreePath, length: int) -> torch.Tensor:
    """(length,) advantages of one path: A(node) on every token of the node's span (0 beyond the spans)."""
    out = torch.zeros(length)
    for node, (s, e) in zip(path.nodes, path.spans):
        out[s:min(e, length)] = node_adv[node]
    return out
