"""AttnRL tree rollouts (docs/algorithms/attnrl.md): sample, score FCI, branch, score, build trees.

One step (:func:`collect_tree_rollouts`):

1. draw B prompts (B = ``train.prompts_per_step`` at the first step, then the dynamic batch size) and sample
   n = ``rollout.group_size`` responses each; score them;
2. the FCI pass (:mod:`credo.methods.attnrl.fci`) scores every response step;
3. per problem, in the order (difficulty, mean FCI): the all-correct ones are dropped unless their mean FCI exceeds
   the running mean over all-correct problems; ceil(n e^{-a}) responses are selected (minority outcome first) and
   each gets ``num_splits`` branch points (:func:`credo.methods.attnrl.algo.branch_points`);
4. ``branch_samples`` continuations per branch point from prompt + response[:idx] (``engine.continue_ids``), each
   capped so that prefix + continuation stays within ``rollout.max_new_tokens``; scored;
5. a tree per problem: the prompt is the root, each response is a chain of segments cut at its branch points, each
   continuation a leaf under the segment that ends at its branch point. Every root-to-leaf path through a branched
   response is one training row (shared prefixes duplicated; the row's ``info["tree_path"]`` is its
   :class:`~credo.methods.attnrl.algo.TreePath`); responses without a branch are leaves that count in the root's value but
   are not trained (``train_unbranched`` trains them too);
6. problems whose trained paths all have one reward are dropped (``filter_zero_std``);
7. the dynamic batch size for the next step from the number of trained rows.

``state`` (a dict: :class:`TreeCollector`'s state, saved in every checkpoint) carries the running FCI mean, the EMA
of trained rows and the next batch size.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from credo.methods.attnrl.algo import (
    Span,
    Tree,
    TreePath,
    branch_budget,
    branch_points,
    ema,
    next_batch_size,
    running_mean,
    segment_steps,
    select_responses,
)
from credo.rewards.shaping import overlong_penalty
from credo.methods.attnrl.config import TreeCollectorConfig
from credo.methods.attnrl.fci import fci_forward
from credo.collect.base import CollectorNeeds
from credo.collect.registry import COLLECTORS, CollectorInputs
from credo.collect.group import StreamingScorer
from credo.tracking.timer import Timer
from credo.train.stats import rollout_metrics
from credo.recipes.estimator_inputs import ESTIMATOR_INPUTS
from credo.types import RewardResult, Rollouts, SamplingParams, Trajectory


@dataclass(frozen=True)
class TreeOptions:
    """What :class:`TreeCollector` reads: the ``rollout.collector`` section of ``type: tree`` plus
    ``rollout.group_size``, ``train.prompts_per_step``, the sampling parameters, ``seed``, ``rollout.one_step_off``
    and ``reward.overlong_*``."""

    collector: TreeCollectorConfig
    group_size: int
    prompts_per_step: int
    sampling: SamplingParams
    seed: int
    one_step_off: bool = False
    overlong_buffer: int = 0
    overlong_factor: float = 1.0

    @classmethod
    def of(cls, cfg) -> "TreeOptions":
        r = cfg.rollout
        return cls(collector=r.collector, group_size=r.group_size, prompts_per_step=cfg.train.prompts_per_step,
                   sampling=SamplingParams.of(r), seed=cfg.seed, one_step_off=r.one_step_off,
                   overlong_buffer=cfg.reward.overlong_buffer, overlong_factor=cfg.reward.overlong_penalty)


@dataclass
class Problem:
    """One prompt's n initial responses, their step spans and FCI scores."""

    trajs: list[Trajectory]
    results: list[RewardResult]
    spans: list[list[Span]] = field(default_factory=list)
    fci: list[torch.Tensor] = field(default_factory=list)

    @property
    def correct(self) -> list[bool]:
        return [r.correct for r in self.results]

    @property
    def mean_fci(self) -> float:
        """Mean over responses of the mean FCI over the response's steps (0 for an empty response)."""
        return sum(float(y.mean()) if y.numel() else 0.0 for y in self.fci) / max(len(self.fci), 1)


@dataclass
class Branch:
    problem: int
    response: int
    offset: int  # branch at this response token: the prefix is response[:offset]
    traj: Trajectory | None = None  # the whole path: prefix + continuation
    result: RewardResult | None = None


def collect_tree_rollouts(opts: TreeOptions, engine, runner, sampler, model, tokenizer, *, state: dict[str, Any],
                          step: int, timer=None) -> Rollouts:
    """One step's AttnRL rollouts (module docstring); ``model`` runs the FCI pass (the policy that sampled)."""
    a, timer, sampling = opts.collector, timer or Timer(), opts.sampling  # a throwaway timer when none is given
    n, prompts = opts.group_size, int(state.get("batch_size") or opts.prompts_per_step)
    with StreamingScorer(runner, min_batch=max(1, prompts * n // 4), step=step) as scorer:
        with timer("gen"):
            trajs = engine.generate(sampler.next_batch(prompts), n, sampling, on_done=scorer.submit)
        with timer("reward"):
            results = [_shape(opts, t, r) for t, r in zip(trajs, scorer.results(trajs))]
    problems = [Problem(trajs[i:i + n], results[i:i + n]) for i in range(0, len(trajs), n)]
    with timer("fci"):
        score_steps(problems, model, tokenizer, a)
    branches, dropped_easy = plan_branches(problems, a, state, n=n,
                                           generator=torch.Generator().manual_seed(opts.seed * 1_000_003 + step))
    sample_branches(opts, engine, runner, tokenizer, problems, branches, sampling, timer)
    trees = build_trees(problems, branches, dropped_easy, train_unbranched=a.train_unbranched)
    kept, dropped_zero = filter_trees(trees, a.filter_zero_std)
    out_trajs, out_results = [], []
    for new_id, rows in enumerate(kept):
        out_trajs += [dataclasses.replace(t, group_id=new_id) for t, _ in rows]
        out_results += [r for _, r in rows]
    metrics = rollout_metrics(trajs + [b.traj for b in branches], results + [b.result for b in branches])
    metrics.update(tree_metrics(problems, branches, trees, out_trajs, dropped_easy, dropped_zero, prompts))
    metrics.update(update_batch_size(opts, state, prompts, len(out_trajs)))
    return Rollouts(out_trajs, out_results, metrics, sampling=sampling)


class TreeCollector:
    """AttnRL's collection (``rollout.collector.type=tree``): :func:`collect_tree_rollouts` each step, the FCI pass
    on the policy that sampled (:func:`fci_model`). Its running state (dynamic batch size, running FCI mean) is
    saved with the sampler's under ``"attnrl"`` (the key a checkpoint's run state held it under before)."""

    needs = CollectorNeeds()

    def __init__(self, opts: TreeOptions, engine, runner_for: Callable[[int], Any], sampler, policy, tokenizer
                 ) -> None:
        self.opts, self.engine, self.runner_for, self.sampler = opts, engine, runner_for, sampler
        self.policy, self.tokenizer = policy, tokenizer
        self.state: dict[str, Any] = {}

    def start(self, run_dir: Path) -> None:
        """Nothing to prepare before the first step."""

    def collect(self, step: int, timer) -> Rollouts:
        model = fci_model(self.engine, self.policy, one_step_off=self.opts.one_step_off)
        return collect_tree_rollouts(self.opts, self.engine, self.runner_for(step), self.sampler, model,
                                     self.tokenizer, state=self.state, step=step, timer=timer)

    def rewards(self, batch, trajs):
        """The leaf rewards, (B,) (the estimator reads the trees from ``info["tree_path"]``)."""
        return batch.scores

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(), "attnrl": copy.deepcopy(self.state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.state = dict(state.get("attnrl") or {})


# ----------------------------------------------------------------------------- FCI and branch points

def score_steps(problems: list[Problem], model, tokenizer, a: TreeCollectorConfig) -> None:
    """Step spans and FCI scores of every initial response (in place)."""
    trajs = [t for p in problems for t in p.trajs]
    texts = _token_texts(tokenizer)
    spans = [segment_steps([texts(i) for i in t.response_ids], step_tokens=a.step_tokens) for t in trajs]
    stops = [_stop_step(t.response_ids, s, texts, a.think_end) for t, s in zip(trajs, spans)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scores = fci_forward(model, [t.prompt_ids for t in trajs], [t.response_ids for t in trajs], spans, pad_id=pad,
                         ignore=a.ignore, stop_steps=stops, micro_batch=a.fci_micro_batch)
    i = 0
    for p in problems:
        p.spans, p.fci = spans[i:i + len(p.trajs)], scores[i:i + len(p.trajs)]
        i += len(p.trajs)


def plan_branches(problems: list[Problem], a: TreeCollectorConfig, state: dict[str, Any], *, n: int,
                  generator: torch.Generator) -> tuple[list[Branch], set[int]]:
    """The branch points of every problem (``branch_samples`` copies each) and the all-correct problems dropped by
    the running-mean FCI filter. Updates ``state["fci_mean"]`` with this batch's all-correct problems first, as the
    reference does."""
    easy = [q for q, p in enumerate(problems) if all(p.correct)]
    state["fci_mean"], state["fci_count"] = running_mean(state.get("fci_mean"), int(state.get("fci_count", 0)),
                                                         [problems[q].mean_fci for q in easy])
    accuracy = [sum(p.correct) / max(len(p.correct), 1) for p in problems]
    order = sorted(range(len(problems)), key=lambda q: -((2 - accuracy[q]) * 100 + problems[q].mean_fci))
    branches, dropped = [], set()
    for q in order:
        p = problems[q]
        if q in easy and a.easy_filter and not p.mean_fci > state["fci_mean"]:
            dropped.add(q)
            continue
        for i in select_responses(p.correct, branch_budget(sum(p.correct), n, mode=a.budget), generator):
            offset = len(p.trajs[i].prompt_ids)
            points = branch_points(p.fci[i], p.spans[i], num=a.num_splits, quantile=a.quantile,
                                   min_position=a.min_position, min_gap=a.min_gap, offset=offset)
            branches += [Branch(q, i, idx) for idx in sorted(points) for _ in range(a.branch_samples)]
    branches.sort(key=lambda b: (b.problem, b.response, b.offset))
    return branches, dropped


def sample_branches(opts: TreeOptions, engine, runner, tokenizer, problems: list[Problem], branches: list[Branch],
                    sampling: SamplingParams, timer) -> None:
    """A continuation of prompt + response[:offset] for every branch, within ``max_new_tokens`` in all; scored."""
    if not branches:
        return
    cap = sampling.max_new_tokens
    sources = [problems[b.problem].trajs[b.response] for b in branches]
    # one call: a sample cut at k tokens is a sample drawn with a budget of k, so the longest budget serves all
    longest = dataclasses.replace(sampling, max_new_tokens=cap - min(b.offset for b in branches))
    with timer("gen"):
        conts = engine.continue_ids([t.prompt_ids + t.response_ids[:b.offset] for t, b in zip(sources, branches)],
                                    longest)
    for b, src, cont in zip(branches, sources, conts):
        budget = cap - b.offset
        ids, logps, stopped = cont.ids[:budget], cont.logprobs[:budget], cont.finish_reason == "stop"
        stopped = stopped and len(cont.ids) <= budget
        full = src.response_ids[:b.offset] + ids
        b.traj = dataclasses.replace(
            src, response_ids=full, rollout_logprobs=src.rollout_logprobs[:b.offset] + logps,
            response_mask=[1] * len(full), finish_reason="eos" if stopped else "length",
            response_text=tokenizer.decode(full[:-1] if stopped else full, skip_special_tokens=True), info={})
    with timer("reward"):
        scored = runner.score([b.traj.response_text for b in branches], [b.traj.example for b in branches])
    for b, r in zip(branches, scored):
        b.result = _shape(opts, b.traj, r)


# ----------------------------------------------------------------------------- trees

def build_trees(problems: list[Problem], branches: list[Branch], dropped: set[int], *,
                train_unbranched: bool = False) -> dict[int, list[tuple[Trajectory, RewardResult]]]:
    """Problem index -> its training rows (trajectory with ``info["tree_path"]``, leaf reward), for the problems
    not dropped; a problem with no trainable path maps to an empty list."""
    by_response: dict[tuple[int, int], list[Branch]] = {}
    for b in branches:
        by_response.setdefault((b.problem, b.response), []).append(b)
    out: dict[int, list[tuple[Trajectory, RewardResult]]] = {}
    for q, p in enumerate(problems):
        if q in dropped:
            continue
        tree, rows = Tree(), []
        for i, (traj, result) in enumerate(zip(p.trajs, p.results)):
            rows += _response_paths(tree, traj, result, by_response.get((q, i), []), train_unbranched)
        out[q] = rows
    return out


def _response_paths(tree: Tree, traj: Trajectory, result: RewardResult, branches: list[Branch],
                    train_unbranched: bool) -> list[tuple[Trajectory, RewardResult]]:
    """Add one response and its branches to ``tree``; its training rows (the response's own path first)."""
    splits = sorted({b.offset for b in branches})
    bounds = [0, *splits, len(traj.response_ids)]
    segments, parent = [], 0
    for _ in range(len(bounds) - 1):
        parent = tree.add(parent)
        segments.append(parent)
    spans = [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]
    tree.leaf_rewards[segments[-1]] = result.score
    rows = []
    if splits or train_unbranched:
        path = TreePath(tree, tuple(segments), tuple(spans))
        rows.append((dataclasses.replace(traj, info={**traj.info, "tree_path": path}), result))
    for b in branches:
        k = splits.index(b.offset)  # the branch hangs under segment k, which ends at the branch point
        leaf = tree.add(segments[k])
        tree.leaf_rewards[leaf] = b.result.score
        path = TreePath(tree, (*segments[:k + 1], leaf), (*spans[:k + 1], (b.offset, len(b.traj.response_ids))))
        rows.append((dataclasses.replace(b.traj, info={**b.traj.info, "tree_path": path}), b.result))
    return rows


def filter_trees(trees: dict[int, list[tuple[Trajectory, RewardResult]]], zero_std: bool):
    """(kept problems' rows in problem order, number dropped for equal rewards on every trained path)."""
    kept, dropped = [], 0
    for rows in trees.values():
        if not rows:
            continue
        if zero_std and len({r.score for _, r in rows}) == 1:
            dropped += 1
            continue
        kept.append(rows)
    return kept, dropped


# ----------------------------------------------------------------------------- dynamic batch size and metrics

def update_batch_size(opts: TreeOptions, state: dict[str, Any], prompts: int, valid: int) -> dict[str, float]:
    """Record this step's trained rows and set the next step's prompt count (``dynamic_batch``)."""
    a = opts.collector
    state["valid_ema"] = ema(state.get("valid_ema"), float(valid), a.valid_ema)
    nxt = prompts
    if a.dynamic_batch:
        target = a.valid_factor * opts.prompts_per_step * opts.group_size
        nxt = next_batch_size(prompts, state["valid_ema"], target=target, beta=a.batch_ema)
        if a.max_prompts is not None:
            nxt = min(nxt, a.max_prompts)
    state["batch_size"] = nxt
    return {"tree/valid_ema": state["valid_ema"], "tree/next_prompts": float(nxt)}


def tree_metrics(problems, branches, trees, out_trajs, dropped_easy, dropped_zero, prompts) -> dict[str, float]:
    branched = {(b.problem, b.response) for b in branches}
    points = {(b.problem, b.response, b.offset) for b in branches}
    empty = sum(1 for rows in trees.values() if not rows)
    cont_acc = sum(b.result.correct for b in branches) / len(branches) if branches else 0.0
    init = [r.correct for p in problems for r in p.results]
    offsets = [b.offset / max(len(problems[b.problem].trajs[b.response].response_ids), 1) for b in branches]
    kept = len({t.group_id for t in out_trajs})
    return {"tree/prompts": float(prompts), "tree/branched_responses": float(len(branched)),
            "tree/branch_points": float(len(points)), "tree/continuations": float(len(branches)),
            "tree/leaves": float(len(init) + len(branches)), "tree/paths": float(len(out_trajs)),
            "tree/kept_problems": float(kept), "tree/dropped_problems": float(len(problems) - kept),
            "tree/dropped_easy": float(len(dropped_easy)), "tree/dropped_zero_std": float(dropped_zero),
            "tree/dropped_unbranched": float(empty), "tree/initial_acc": sum(init) / max(len(init), 1),
            "tree/continuation_acc": cont_acc,
            "tree/fci_mean": sum(p.mean_fci for p in problems) / max(len(problems), 1),
            "tree/branch_offset_frac": sum(offsets) / len(offsets) if offsets else 0.0,
            "filter/kept_groups": float(kept), "filter/dropped_groups": float(len(problems) - kept)}


# ----------------------------------------------------------------------------- helpers

def fci_model(engine, policy, *, one_step_off: bool):
    """The module the FCI pass runs on: the in-process engine's copy of the sampling policy, else the policy itself
    (only when it is whole and not being updated while the rollouts are collected)."""
    served = getattr(engine, "model", None)
    if isinstance(served, torch.nn.Module):
        return served
    from credo.train.fsdp import is_sharded

    if one_step_off or is_sharded(policy):
        raise NotImplementedError("attnrl: the FCI pass needs the sampling policy in this process; with "
                                  "rollout.one_step_off or a sharded policy use rollout.engine=hf without Ray")
    return policy


def _token_texts(tokenizer):
    cache: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in cache:
            cache[i] = tokenizer.decode([i])
        return cache[i]

    return text


def _stop_step(ids: list[int], spans: list[Span], texts, marker: str | None) -> int | None:
    """Sequence-numbered step (1 + response step) holding the last token that decodes to ``marker``, or None."""
    if not marker:
        return None
    hits = [t for t, i in enumerate(ids) if texts(i).strip() == marker]
    if not hits:
        return None
    return 1 + next(k for k, (s, e) in enumerate(spans) if s <= hits[-1] < e)


def _shape(opts: TreeOptions, traj: Trajectory, result: RewardResult) -> RewardResult:
    """DAPO's overlong shaping of one response's score (``reward.overlong_buffer`` > 0)."""
    if opts.overlong_buffer <= 0:
        return result
    pen = overlong_penalty(len(traj.response_ids), max_len=opts.sampling.max_new_tokens, buffer=opts.overlong_buffer,
                           factor=opts.overlong_factor)
    return dataclasses.replace(result, score=result.score + pen, info={**result.info, "overlong_penalty": pen})


__all__ = ["Branch", "Problem", "TreeCollector", "TreeOptions", "build_trees", "collect_tree_rollouts", "fci_model",
           "filter_trees", "plan_branches"]


# ----------------------------------------------------------------------------- registrations (the step's extension points)

@COLLECTORS.register("tree")
def _build_tree_collector(x: CollectorInputs) -> TreeCollector:
    """``rollout.collector.type=tree``."""
    return TreeCollector(TreeOptions.of(x.cfg), x.engine, x.runner_for, x.sampler, x.model, x.tokenizer)


# the tree estimator's input: each row's TreePath, carried in its trajectory's info
ESTIMATOR_INPUTS.add("tree_paths", lambda x: [t.info["tree_path"] for t in x.rollouts.trajs])
