"""Entropy-driven branching rollouts for tool-using agents: ARPO and AEPO
(docs/agents.md#arpo-and-aepo-branching-rollouts-credorolloutbranchingpy; AEPO's loss: docs/algorithms/aepo.md).

**ARPO** (reference ``vllm_rollout_with_tools.generate_sequences``), per prompt with budget ``n``:

1. start ``initial_rollouts`` global samples;
2. every round, generate one turn for each active episode and step the environment; for each episode
   still active after a tool result, with H_t the entropy of the segment it just generated and H_init the
   entropy of its own first segment (reset per batch, keyed per trajectory: the reference's stale
   per-index dictionary is the hazard avoided), draw u ~ U(0, 1), p = clip(u - entropy_weight (H_t - H_init),
   0, 1), and branch if p <= branch_probability while the prompt has free slots, at most ``beam_size - 1``
   branches per episode per round;
3. a branch copies the episode's prefix exactly (prompt, every token so far including the tool result, its
   mask and log-probs) and an environment in the same state, then continues sampling independently;
4. fill-up: a prompt with no active episode left but fewer than ``n`` episodes gets one fresh global sample
   per round until its budget is full.

Segment entropy is ARPO's: the top-k (10) log-probs of the first <= 20 generated tokens, -sum p log p over
all of them (a sum, not a mean), divided by log |V|. Reading [derived]: the branch point is the end of a
round, after the tool result is appended; ``branch_on="any"`` also branches after plain environment
observations (for environments without tools). credo implements this reading and documents it.

**AEPO** [paper, secondary; derived readings, all configurable]: entropy pre-monitoring splits the budget:
one probe episode per prompt runs its first round; m = clip(round(n sigmoid(aepo_beta (H_root - H_tool))),
1, n) global samples (the probe is one of them), with H_root the probe's first-segment entropy and H_tool
the mean entropy after tool calls over the batch's probes (H_root when none called a tool); the remaining
n - m slots are for branches. Consecutive high-entropy branching is penalised: an episode that branched in
the previous round has its branch probability multiplied by (1 - consecutive_penalty) per consecutive
branch. The entropy-balanced loss pieces are the registered policy loss ``aepo``.

The number of episodes per prompt never exceeds ``n``, and every branch shares its prefix tokens with its
source exactly (tested).
"""
from __future__ import annotations

import copy
import math
import statistics
from typing import Any, Callable

import torch

from credo.envs import EnvClient, EnvError, LocalEnvClient
from credo.rollout.agent_loop import AgentLoop, Episode, to_trajectory
from credo.types import Example, SamplingParams

ARPO_DEFAULTS = {"initial_rollouts": None, "entropy_weight": 0.2, "branch_probability": 0.5, "beam_size": 2,
                 "top_logprobs": 10, "branch_on": "tool"}
AEPO_DEFAULTS = {**ARPO_DEFAULTS, "aepo_beta": 1.0, "consecutive_penalty": 0.5}


def branched_rollouts(loop: AgentLoop, examples: list[Example], n: int, sampling: SamplingParams,
                      client_factory: Callable[[Example], EnvClient], *, method: str = "arpo",
                      generator: torch.Generator | None = None, **args: Any):
    """(trajectories, rewards, stats) with at most ``n`` episodes per example, grouped by example."""
    defaults = ARPO_DEFAULTS if method == "arpo" else AEPO_DEFAULTS
    unknown = set(args) - set(defaults)
    if unknown:
        raise TypeError(f"{method} branching has no parameter(s) {sorted(unknown)}; it takes: {sorted(defaults)}")
    p = {**defaults, **args}
    gen = generator or torch.Generator().manual_seed(0)
    state = _State(loop, examples, n, sampling, client_factory, p, gen)
    state.run(aepo=method == "aepo")
    pairs = [to_trajectory(ep, loop.tokenizer) for g in range(len(examples)) for ep in state.groups[g]]
    return [t for t, _ in pairs], [r for _, r in pairs], state.stats()


class _State:
    def __init__(self, loop, examples, n, sampling, client_factory, params, gen):
        self.loop, self.examples, self.n, self.sampling = loop, examples, n, sampling
        self.client_factory, self.p, self.gen = client_factory, params, gen
        self.groups: list[list[Episode]] = [[] for _ in examples]
        self.consecutive: dict[int, int] = {}  # id(episode) -> branches in consecutive rounds (AEPO penalty)
        self.counts = {"global": 0, "branch": 0, "fill": 0}
        self.budget_split: list[int] = []
        # one row per branch decision (a draw against the branch probability): (H_t, H_t - H_init, branches made,
        # consecutive branching rounds before it); summarised by decision_stats
        self.decisions: list[tuple[float, float, int, int]] = []

    # ---------------------------------------------------------------- episodes
    def _new(self, g: int, kind: str) -> Episode:
        ex = self.examples[g]
        (ep,) = self.loop.start([ex], [self.client_factory(ex)], [g])
        self.groups[g].append(ep)
        self.counts[kind] += 1
        return ep

    def _fork(self, src: Episode, g: int) -> Episode | None:
        """A branch: the same prefix tokens, mask, log-probs and turns, and an environment in the same state
        (None if the environment could not be reproduced)."""
        try:
            client = _fork_client(src, self.client_factory)
        except EnvError:
            return None
        ep = copy.copy(src)
        for name in ("prompt_ids", "response_ids", "mask", "logprobs", "turns", "turn_entropy", "actions"):
            setattr(ep, name, list(getattr(src, name)))
        ep.client = client
        ep.kv = copy.copy(src.kv)  # its own session (the engine reassigns a session's tensors, never edits them)
        ep.branched_from = self.groups[g].index(src)
        ep.fork_at = len(src.response_ids)
        return ep

    def _u(self) -> float:
        return float(torch.rand((), generator=self.gen))

    # ---------------------------------------------------------------- main loop
    def run(self, aepo: bool) -> None:
        n = self.n
        if aepo:
            initial = self._premonitor()
        else:
            m = self.p["initial_rollouts"] or max(1, n // 2)
            initial = [min(m, n)] * len(self.examples)
            for g, m_g in enumerate(initial):
                for _ in range(m_g):
                    self._new(g, "global")
        self.budget_split = initial
        while True:
            active = [ep for eps in self.groups for ep in eps if not ep.done]
            if not active:
                if not self._fill():
                    break
                continue
            self.loop.turn(active, self.sampling)
            self._branch(active, aepo)
            self._fill()

    def _premonitor(self) -> list[int]:
        """AEPO: one probe per prompt runs a round; its entropies set the global / branch split."""
        probes = [self._new(g, "global") for g in range(len(self.examples))]
        self.loop.turn([ep for ep in probes if not ep.done], self.sampling)
        roots = [ep.turn_entropy[0] if ep.turn_entropy else 0.0 for ep in probes]
        tools = [ep.turn_entropy[-1] for ep in probes if ep.tool_calls and ep.turn_entropy]
        h_tool = sum(tools) / len(tools) if tools else None
        split = []
        for g, h_root in enumerate(roots):
            ratio = 1.0 / (1.0 + math.exp(-self.p["aepo_beta"] * (h_root - (h_tool if h_tool is not None else h_root))))
            m = min(max(int(round(self.n * ratio)), 1), self.n)
            split.append(m)
            for _ in range(m - 1):  # the probe is the first global sample
                self._new(g, "global")
        return split

    def _branch(self, stepped: list[Episode], aepo: bool) -> None:
        per_ep_limit = self.p["beam_size"] - 1
        branched_now = set()
        for g, eps in enumerate(self.groups):
            for ep in [e for e in eps if e in stepped and not e.done]:
                if len(eps) >= self.n:
                    break
                if len(ep.turn_entropy) < 2 or (self.p["branch_on"] == "tool" and not ep.tool_calls):
                    continue  # branch only after a tool result (or any observation), once H_init exists
                delta = ep.turn_entropy[-1] - ep.turn_entropy[0]
                # ARPO: branch iff clip(u - w dH, 0, 1) <= tau, i.e. with probability clip(tau + w dH, 0, 1)
                prob = min(max(self.p["branch_probability"] + self.p["entropy_weight"] * delta, 0.0), 1.0)
                if aepo:  # AEPO: damp episodes that branched in the previous round(s)
                    prob *= (1.0 - self.p["consecutive_penalty"]) ** self.consecutive.get(id(ep), 0)
                made = 0
                while made < per_ep_limit and len(eps) < self.n:
                    if not self._u() < prob:
                        break
                    branch = self._fork(ep, g)
                    if branch is None:
                        break
                    eps.append(branch)
                    self.counts["branch"] += 1
                    made += 1
                self.decisions.append((ep.turn_entropy[-1], delta, made, self.consecutive.get(id(ep), 0)))
                if made:
                    branched_now.add(id(ep))
        self.consecutive = {k: self.consecutive.get(k, 0) + 1 for k in branched_now}

    def _fill(self) -> bool:
        """One fresh global sample for every prompt that has no active episode and free budget."""
        added = False
        for g, eps in enumerate(self.groups):
            if len(eps) < self.n and all(ep.done for ep in eps):
                self._new(g, "fill")
                added = True
        return added

    def stats(self) -> dict[str, float]:
        sizes = [len(eps) for eps in self.groups]
        return {"branch/global": self.counts["global"], "branch/branches": self.counts["branch"],
                "branch/fill": self.counts["fill"], "branch/episodes_per_prompt": sum(sizes) / max(len(sizes), 1),
                "branch/initial_mean": sum(self.budget_split) / max(len(self.budget_split), 1),
                **decision_stats(self.decisions)}


def decision_stats(decisions: list[tuple[float, float, int, int]]) -> dict[str, float]:
    """Where the branches were taken (docs/agents.md#arpo-and-aepo-branching-rollouts-credorolloutbranchingpy), from
    one ``(H_t, dH, branches made, consecutive rounds before)`` row per branch decision: ``branch/decisions``;
    the mean segment entropy H_t and entropy change dH = H_t - H_init at the decisions that branched
    (``branch/entropy_branched``, ``branch/dH_branched``) and at those that did not (``..._unbranched``);
    ``branch/above_median_branched`` / ``branch/above_median_unbranched``, the share of the branching / the other
    decisions whose H_t is above the median H_t of all decisions (both about 0.5 when branching ignores entropy);
    ``branch/consecutive_share``, the share of branching
    decisions taken by an episode that also branched in the previous round (what AEPO's penalty lowers). A key
    whose set of decisions is empty is left out (no value, rather than a made-up 0)."""
    out: dict[str, float] = {"branch/decisions": float(len(decisions))}
    took = [d for d in decisions if d[2] > 0]
    left = [d for d in decisions if d[2] == 0]
    median = statistics.median(d[0] for d in decisions) if decisions else 0.0
    for name, rows in (("branched", took), ("unbranched", left)):
        if rows:
            out[f"branch/entropy_{name}"] = sum(d[0] for d in rows) / len(rows)
            out[f"branch/dH_{name}"] = sum(d[1] for d in rows) / len(rows)
            out[f"branch/above_median_{name}"] = sum(d[0] > median for d in rows) / len(rows)
    if took:
        out["branch/consecutive_share"] = sum(d[3] > 0 for d in took) / len(took)
    return out


def _fork_client(src: Episode, factory: Callable[[Example], EnvClient]) -> EnvClient:
    """An environment in the same state as ``src``'s: a deep copy of an in-process one, or a fresh instance
    with the episode's actions replayed (HTTP; built-in environments are deterministic per task)."""
    if isinstance(src.client, LocalEnvClient):
        return copy.deepcopy(src.client)
    client = factory(src.example)
    client.reset(src.task_id)
    for action in src.actions:
        client.step(action)
    return client
