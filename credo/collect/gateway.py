"""The ``gateway`` collector (``rollout.collector.type=gateway``): the user's own agent, run ``rollout.group_size``
times per prompt of every step against credo's OpenAI-compatible gateway (credo.gateway.server), trained on the
exact tokens the engine sampled (docs/bring-your-own.md).

    gateway   = Gateway(engine, tokenizer, ...)    # started once, at the first step, in front of the run's engine
    episodes  = agent(row, client) x group_size    # per row of the step, at most `concurrency` at once, each
                                                   # with its own key and deadline (credo.collect.gateway_agents)
    segments  = stitch(record.calls)               # per episode: one trajectory when every call extends the last
                                                   # context token for token, else several sharing the reward
    reward    = what the agent returned (reward_of), or the run's verifier on the last completion's text

A failed episode (the agent raised, timed out, a command exited non-zero or printed no JSON reward, a bad reward,
no call at all, an agent ended by a refused call past the episode's limits) is counted (``gateway/failed/<reason>``) and never trained on; a group left with fewer than
``min(2, group_size)`` good episodes is dropped (one survivor has no group baseline); a step where more than
``max_failed_share`` of the episodes failed stops the run (:class:`AgentOutageError`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from credo.faults import kill_point
from credo.collect.base import CollectorNeeds
from credo.collect.config import GatewayCollectorConfig
from credo.collect.gateway_agents import LIMIT_CODES, REASONS, AgentSpec, EpisodeFailed, one_line, verifiers_source
from credo.errors import EXIT_ENV_FAILURE, RunStopped
from credo.gateway.contract import AgentResultError, reward_of
from credo.tracking.atomic import atomic_write_text
from credo.train.stats import rollout_metrics
from credo.types import Example, RewardResult, Rollouts, SamplingParams, Trajectory

log = logging.getLogger(__name__)

ROW_KEY = "task_row"  # Example.meta key of a row that came as a dict (a verifiers environment's)


class AgentOutageError(RunStopped):
    """More than ``rollout.collector.max_failed_share`` of a step's episodes failed: the run stops with one line,
    ``credo: agent failure: ...``, exit code 3 (credo.errors), as the agent collector's environment outage."""

    label = "agent failure"
    exit_code = EXIT_ENV_FAILURE


@dataclass(frozen=True)
class GatewayOptions:
    """What the gateway collector reads: its ``rollout.collector`` section, ``rollout.group_size``,
    ``train.prompts_per_step``, the training sampling and ``rollout.max_new_tokens`` (the per-call cap)."""

    collector: GatewayCollectorConfig
    group_size: int
    prompts_per_step: int
    sampling: SamplingParams

    @classmethod
    def of(cls, cfg) -> "GatewayOptions":
        return cls(collector=cfg.rollout.collector, group_size=cfg.rollout.group_size,
                   prompts_per_step=cfg.train.prompts_per_step, sampling=SamplingParams.of(cfg.rollout))


# ----------------------------------------------------------------------------- task rows

def row_example(row: dict, index: int, split: str, name: str) -> Example:
    """An agent source's task row as an Example (the row itself kept under ``meta[ROW_KEY]``)."""
    if not isinstance(row, dict):
        raise TypeError(f"{name}: {split} row {index} is a {type(row).__name__}, not a dict")
    prompt = row.get("prompt", "")
    return Example(prompt=prompt if isinstance(prompt, str) else json.dumps(prompt, default=str),
                   answer="" if row.get("answer") is None else str(row["answer"]), uid=str(row.get("uid", f"{name}/{split}/{index}")),
                   meta={ROW_KEY: row})


def task_row(ex: Example) -> dict:
    """The task row handed to the agent: the source's own row, else the Example's fields (prompt, answer, uid and
    its metadata)."""
    if ROW_KEY in ex.meta:
        return ex.meta[ROW_KEY]
    return {**ex.meta, "prompt": ex.prompt, "answer": ex.answer, "uid": ex.uid}


def gateway_task_data(cfg, seed: int):
    """TaskData of a gateway run: a verifiers environment's own rows (``rows("train" | "eval", size, seed)``), else
    ``task.*``'s (built-in tasks, files, hub datasets)."""
    from credo.data.source import TaskData, load_task_data

    g = cfg.rollout.collector
    if g.verifiers is None:
        return load_task_data(cfg.task, seed=seed)
    source = verifiers_source(g.verifiers)
    data_seed = cfg.task.seed if cfg.task.seed is not None else seed
    name = f"verifiers:{g.verifiers['env']}"
    train = [row_example(r, i, "train", name) for i, r in enumerate(source.rows("train", cfg.task.train_size,
                                                                               data_seed))]
    eval_ = [row_example(r, i, "eval", name) for i, r in enumerate(source.rows("eval", cfg.task.eval_size,
                                                                              data_seed))]
    if not train:
        raise ValueError(f"rollout.collector.verifiers: {name} gave no training rows")
    return TaskData(name=name, train=train, eval=eval_, default_reward=None, demonstration=None)


# ----------------------------------------------------------------------------- episodes

@dataclass
class Episode:
    """One run of the agent on one row: its record, its reward (or why it failed) and its wall time."""

    example: Example
    group: int
    record: Any = None  # credo.gateway.capture.EpisodeRecord
    value: Any = None  # what the agent returned
    failure: str = ""  # a REASONS entry; "" = not failed
    error: str = ""
    seconds: float = 0.0
    result: RewardResult | None = None


def run_episodes(gateway, agent: AgentSpec, g: GatewayCollectorConfig, examples: list[Example], n: int,
                 prefix: str, step: int | None = None) -> list[Episode]:
    """``n`` episodes per example (episode ``prefix/<row>/<k>``), at most ``g.concurrency`` at once, each closed
    after its agent returned or failed."""

    async def one(ex: Example, group: int, k: int, gate: asyncio.Semaphore) -> Episode:
        ep = Episode(ex, group)
        async with gate:
            t0 = time.perf_counter()
            client = gateway.open_episode(f"{prefix}/{group}/{k}", deadline_s=g.episode_timeout_s)
            try:
                ep.value = await agent.run(task_row(ex), client, g.episode_timeout_s)
            except EpisodeFailed as exc:
                ep.failure, ep.error = exc.reason, str(exc)
            finally:
                ep.record = gateway.close_episode(client)
                ep.seconds = time.perf_counter() - t0
            kill_point("generate", step)  # an episode of the step's batch is in (credo/faults.py)
        limit = [r for r in ep.record.refused if r.startswith(LIMIT_CODES)]
        if ep.failure in ("raised", "exit_code") and limit:  # it ended because a call was refused
            ep.failure, ep.error = "limit", f"{one_line(limit[0], 160)} (then: {ep.error})"
        return ep

    async def every() -> list[Episode]:
        gate = asyncio.Semaphore(g.concurrency)
        return list(await asyncio.gather(*(one(ex, i, k, gate) for i, ex in enumerate(examples) for k in range(n))))

    return asyncio.run(every())


def score_episodes(episodes: list[Episode], runner, *, reward_from: str) -> None:
    """Each episode's RewardResult (``ep.result``), or its failure: the agent's reward (reward_of) unless
    ``reward_from`` is ``verifier`` or the agent returned None, then ``runner`` (the run's verifier) on the text of
    the last completion. An agent reward is correct when positive."""
    to_verify = []
    for ep in episodes:
        if ep.failure:
            continue
        if not ep.record.calls:
            ep.failure, ep.error = "no_calls", "the agent made no model call (nothing to train on)"
            continue
        try:
            reward, comps = (None, {}) if reward_from == "verifier" else reward_of(ep.value)
        except AgentResultError as exc:
            ep.failure, ep.error = "bad_reward", str(exc)
            continue
        if reward is not None:
            ep.result = RewardResult(score=reward, correct=reward > 0, info={"components": comps} if comps else {})
        elif runner is None:
            ep.failure, ep.error = "bad_reward", ("the agent returned None (the verifier is to score) but the run "
                                                  "has no verifier (reward.name)")
        else:
            to_verify.append(ep)
    if to_verify:
        results = runner.score([ep.record.calls[-1].text for ep in to_verify], [ep.example for ep in to_verify])
        for ep, r in zip(to_verify, results):
            ep.result = r


def trajectories(ep: Episode, tokenizer, group_id: int, version: int) -> list[Trajectory]:
    """The episode's stitched segments that hold a sampled token, as trajectories of group ``group_id``; each
    call's completion is a turn ``[start, end)`` in response coordinates."""
    calls = ep.record.calls
    out = []
    for seg in ep.record.segments():
        if not any(seg.response_mask):
            continue
        last = calls[seg.calls[-1]]
        turns = [(len(calls[i].prompt_ids) - len(seg.prompt_ids),
                  len(calls[i].prompt_ids) - len(seg.prompt_ids) + len(calls[i].completion_ids)) for i in seg.calls]
        versions = [calls[i].policy_version for i in seg.calls if calls[i].policy_version is not None]
        out.append(Trajectory(
            example=ep.example, group_id=group_id, prompt_ids=list(seg.prompt_ids),
            response_ids=list(seg.response_ids), rollout_logprobs=list(seg.logprobs),
            response_mask=list(seg.response_mask), finish_reason="length" if last.finish_reason == "length" else "eos",
            response_text=tokenizer.decode(seg.response_ids, skip_special_tokens=True), turns=turns,
            info={"num_turns": len(seg.calls), "calls": len(calls), "segments": len(ep.record.segments()),
                  "split_reason": seg.reason, "tool_calls": sum(len(calls[i].tool_calls) for i in seg.calls)},
            policy_version=min(versions) if versions else version))
    return out


def episode_metrics(episodes: list[Episode], prefix: str = "gateway") -> dict[str, float]:
    """Per step: episodes, failed ones by reason, calls / refused calls / segments / tokens per episode, stitched
    and split episodes by split kind, the mean reward of the scored episodes and the mean episode time."""
    n = max(len(episodes), 1)
    failed = Counter(ep.failure for ep in episodes if ep.failure)
    summaries = [ep.record.summary() for ep in episodes if ep.record is not None]
    with_calls = [s for s in summaries if s["calls"]]
    splits = Counter(k for s in with_calls for k in s["split_kinds"])  # "branched" | "diverged"
    rewards = [ep.result.score for ep in episodes if ep.result is not None and not ep.failure]
    out = {f"{prefix}/episodes": float(len(episodes)), f"{prefix}/failed_episodes": float(sum(failed.values())),
           f"{prefix}/failed_share": sum(failed.values()) / n,
           **{f"{prefix}/failed/{r}": float(failed.get(r, 0)) for r in REASONS},
           f"{prefix}/calls_per_episode": sum(s["calls"] for s in summaries) / n,
           f"{prefix}/refused_calls": float(sum(s["refused"] for s in summaries)),
           f"{prefix}/segments_per_episode": sum(s["segments"] for s in with_calls) / max(len(with_calls), 1),
           f"{prefix}/stitched_episodes": float(sum(s["segments"] == 1 for s in with_calls)),
           f"{prefix}/split_episodes": float(sum(s["segments"] > 1 for s in with_calls)),
           **{f"{prefix}/split/{k}": float(splits.get(k, 0)) for k in ("branched", "diverged")},
           f"{prefix}/prompt_tokens": sum(s["prompt_tokens"] for s in summaries) / n,
           f"{prefix}/completion_tokens": sum(s["completion_tokens"] for s in summaries) / n,
           f"{prefix}/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
           f"{prefix}/episode_s": sum(ep.seconds for ep in episodes) / n}
    return out


def check_failures(episodes: list[Episode], *, max_share: float, step: int) -> None:
    """Raise :class:`AgentOutageError` when more than ``max_share`` of the step's episodes failed; warn when any
    did (one line per distinct error)."""
    failed = [ep for ep in episodes if ep.failure]
    if not failed:
        return
    share = len(failed) / len(episodes)
    kinds = list(dict.fromkeys(f"{ep.failure}: {one_line(ep.error, 160)}" for ep in failed))
    if share > max_share:
        raise AgentOutageError(f"RL step {step + 1}: {len(failed)} of {len(episodes)} agent episodes failed "
                               f"({share:.0%} > rollout.collector.max_failed_share={max_share:g}); first: {kinds[0]}")
    log.warning("RL step %d: %d of %d agent episodes failed and are left out of the update: %s", step + 1,
                len(failed), len(episodes), " | ".join(kinds[:8]))


def training_rows(episodes: list[Episode], tokenizer, *, group_size: int, version: int
                  ) -> tuple[list[Trajectory], list[RewardResult], dict[str, float]]:
    """The trajectories to train on and their results: the segments of the good episodes of every group with at
    least ``min(2, group_size)`` good episodes, groups renumbered 0..K-1."""
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    trajs: list[Trajectory] = []
    results: list[RewardResult] = []
    kept = 0
    for eps in groups.values():
        rows = [(ep, trajectories(ep, tokenizer, kept, version)) for ep in eps if not ep.failure]
        rows = [(ep, ts) for ep, ts in rows if ts]
        if len(rows) < min(2, group_size):
            continue
        for ep, ts in rows:
            trajs += ts
            results += [ep.result] * len(ts)
        kept += 1
    return trajs, results, {"gateway/kept_groups": float(kept), "gateway/dropped_groups": float(len(groups) - kept),
                            "gateway/trained_rows": float(len(trajs))}


# ----------------------------------------------------------------------------- the collector

def make_gateway(engine, tokenizer, g: GatewayCollectorConfig, sampling: SamplingParams):
    """A started Gateway in front of ``engine`` with the collector's limits."""
    from credo.gateway.server import Gateway, GatewayLimits

    limits = GatewayLimits(max_calls=g.max_calls, max_tokens=g.max_tokens, concurrency=g.concurrency)
    gateway = Gateway(engine, tokenizer, sampling=sampling, host=g.host, port=g.port, limits=limits,
                      tool_parser=g.tool_parser, render=g.render)
    gateway.start()
    return gateway


class GatewayCollector:
    """The user's agent against the gateway (module docstring). The gateway starts at the first step and serves
    the engine's current weights (each step syncs them before collecting); it stops with the collector."""

    needs = CollectorNeeds()

    def __init__(self, opts: GatewayOptions, engine, tokenizer, sampler, runner_for, agent: AgentSpec) -> None:
        self.opts, self.engine, self.tokenizer, self.sampler = opts, engine, tokenizer, sampler
        self.runner_for, self.agent = runner_for, agent
        self.gateway = None

    def start(self, run_dir: Path) -> None:
        """Nothing to prepare before the first step (the gateway starts at the first collection, resumed runs
        included); its render choice is written to ``run_dir/template_check.json`` then (docs/templates.md)."""
        self.run_dir = run_dir

    def _gateway(self):
        if self.gateway is None:
            self.gateway = make_gateway(self.engine, self.tokenizer, self.opts.collector, self.opts.sampling)
            weakref.finalize(self, self.gateway.stop)
            if getattr(self, "run_dir", None) is not None:
                verdict = self.gateway.verdict
                body = {"append_only": self.gateway.append_only, "verdict": verdict.to_dict() if verdict else None}
                (Path(self.run_dir) / "template_check.json").write_text(json.dumps(body, indent=2) + "\n")
        return self.gateway

    def collect(self, step: int, timer) -> Rollouts:
        o, g = self.opts, self.opts.collector
        with timer("gen"):
            examples = self.sampler.next_batch(o.prompts_per_step)
            episodes = run_episodes(self._gateway(), self.agent, g, examples, o.group_size, f"step{step + 1}",
                                    step=step)
        with timer("reward"):
            score_episodes(episodes, self.runner_for(step), reward_from=g.reward_from)
        metrics = episode_metrics(episodes)
        check_failures(episodes, max_share=g.max_failed_share, step=step)
        trajs, results, kept = training_rows(episodes, self.tokenizer, group_size=o.group_size,
                                             version=self.engine.policy_version)
        metrics.update(kept)
        metrics["render/append_only"] = float(self._gateway().append_only)  # docs/templates.md
        if trajs:
            metrics.update(rollout_metrics(trajs, results))
        return Rollouts(trajs, results, metrics, sampling=o.sampling)

    def rewards(self, batch, trajs):
        """The episodes' rewards, (B,): every segment of an episode carries its reward."""
        return batch.scores

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()


def build_gateway_collector(x) -> GatewayCollector:
    """The ``gateway`` collector of CollectorInputs ``x``."""
    if x.engine is None:
        raise NotImplementedError("rollout.collector.type=gateway needs the rollout engine in this process "
                                  "(not a follower rank)")
    opts = GatewayOptions.of(x.cfg)
    return GatewayCollector(opts, x.engine, x.tokenizer, x.sampler, x.runner_for, AgentSpec.of(opts.collector))


# ----------------------------------------------------------------------------- evaluation

def evaluate_gateway(cfg, engine, runner, examples: list[Example], *, seed: int,
                     samples_path: Path | None = None) -> dict[str, float]:
    """The agent's greedy episodes on the held-out rows, one per row, through a gateway of their own:
    ``eval/greedy_acc`` (share correct: the verifier's verdict, or a positive agent reward),
    ``eval/reward_mean`` and the episode metrics under ``eval/gateway/*``. Failed episodes score 0 and count as
    wrong. The episodes go to ``samples_path`` as JSONL. (``seed`` is unused: greedy episodes draw nothing.)"""
    g = cfg.rollout.collector
    agent = AgentSpec.of(g)
    sampling = SamplingParams(greedy=True, max_new_tokens=cfg.rollout.max_new_tokens)
    gateway = make_gateway(engine, engine.tokenizer, dataclasses.replace(g, port=0), sampling)
    try:
        episodes = run_episodes(gateway, agent, g, examples, 1, "eval")
    finally:
        gateway.stop()
    score_episodes(episodes, runner, reward_from=g.reward_from)
    ok = [ep.result if ep.result is not None and not ep.failure else RewardResult(0.0) for ep in episodes]
    n = max(len(episodes), 1)
    if samples_path is not None:
        _write_samples(samples_path, episodes, ok)
    return {"eval/greedy_acc": sum(r.correct for r in ok) / n, "eval/reward_mean": sum(r.score for r in ok) / n,
            **episode_metrics(episodes, prefix="eval/gateway")}


def _write_samples(path: Path, episodes: list[Episode], results: list[RewardResult]) -> None:
    rows = []
    for ep, r in zip(episodes, results):
        calls = ep.record.calls if ep.record is not None else []
        rows.append({"uid": ep.example.uid, "prompt": ep.example.prompt, "answer": ep.example.answer,
                     "response": calls[-1].text if calls else "", "score": r.score, "correct": r.correct,
                     "calls": len(calls), "failed": ep.failure, "error": ep.error})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(row, default=str) + "\n" for row in rows))
