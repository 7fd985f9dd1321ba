"""Agent RL plumbing for the recipe: env task data, clients, rollout collection, evaluation, oracle demos.

Selected by ``rollout.collector.type=agent`` (:class:`AgentCollector`); the recipe calls the same stages as for
single-turn tasks.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from credo.config import ConfigError, RunConfig
from credo.envs import HTTPEnvClient, LocalEnvClient, eval_task_ids, get_env_spec, train_task_ids
from credo.errors import EXIT_ENV_FAILURE, RunStopped
from credo.guards import agent as agent_guards
from credo.http_auth import resolve_token
from credo.rollout.agent_loop import (AgentLoop, AgentTemplate, chat_template, plain_template, segment_trajectories,
                                     to_trajectory)
from credo.rollout.branching import branched_rollouts
from credo.models.batch import collate
from credo.collect.base import CollectorNeeds
from credo.collect.config import AgentCollectorConfig, remote_adapter, remote_name, with_remote
from credo.collect.horizon import horizon
from credo.rollout.tool_episode import oracle_episode, tool_metrics
from credo.tracking.atomic import atomic_write_text
from credo.train.stats import rollout_metrics
from credo.types import Example, RewardResult, Rollouts, SamplingParams, Trajectory

log = logging.getLogger(__name__)


class EnvOutageError(RunStopped):
    """More than ``rollout.collector.max_env_failure_share`` of a step's episodes failed in the environment: the run
    stops with one line, ``credo: environment failure: ...``, exit code 3 (credo.errors): the environment servers
    failed, not the configuration."""

    label = "environment failure"
    exit_code = EXIT_ENV_FAILURE


@dataclass(frozen=True)
class AgentOptions:
    """What the agent collector, its evaluation and its task data read: the ``rollout.collector`` section of
    ``type: agent`` plus ``rollout.group_size``, ``train.prompts_per_step``, ``eval.k`` / ``eval.temperature``
    and ``task.seed`` / ``task.train_size`` / ``task.eval_size``."""

    collector: AgentCollectorConfig
    group_size: int
    prompts_per_step: int
    eval_k: int
    eval_temperature: float
    task_seed: int | None  # None = the run's seed
    train_size: int
    eval_size: int

    @classmethod
    def of(cls, cfg: RunConfig) -> "AgentOptions":
        t = cfg.task
        return cls(collector=with_remote(cfg.rollout.collector), group_size=cfg.rollout.group_size,
                   prompts_per_step=cfg.train.prompts_per_step, eval_k=cfg.eval.k,
                   eval_temperature=cfg.eval.temperature, task_seed=t.seed, train_size=t.train_size,
                   eval_size=t.eval_size)


# ----------------------------------------------------------------------------- data

def env_examples(env: str, task_ids: list[int], split: str) -> list[Example]:
    return [Example(prompt=f"{env}:{tid}", answer="", uid=f"{env}/{split}/{tid}", meta={"env": env, "task_id": tid})
            for tid in task_ids]


def task_space(a: AgentCollectorConfig, env: str, split: str) -> tuple[int, int] | None:
    """[lo, hi) of ``split``'s task ids: an AgentGym environment's adapter range, an environment's own
    ``EnvSpec.task_space`` (skyrl_gym:<id>: its dataset's rows); None for the rest (every id)."""
    from credo.envs import check_env_params
    from credo.envs.agentgym import is_remote

    if not is_remote(env):
        space = get_env_spec(env).task_space
        return None if space is None else space(check_env_params(env, a.env_params.get(env, {})), split)
    adapter = remote_adapter(a, env)
    return adapter.train_ids if split == "train" else adapter.eval_ids


def agent_train_examples(envs: list[str], weights: list[float] | None, size: int, seed: int,
                         spaces: dict[str, tuple[int, int] | None] | None = None) -> list[Example]:
    """A mixture over ``envs``: each training task is routed to one environment by ``weights``; an environment
    with a bounded id space ``spaces[env] = (lo, hi)`` (AgentGym servers) gets ``lo + id % (hi - lo)``."""
    rng = random.Random(f"credo/env-mixture/{seed}")
    ids = train_task_ids(size, seed)
    chosen = rng.choices(envs, weights=weights, k=size) if len(envs) > 1 else [envs[0]] * size
    spaces = spaces or {}
    out = []
    for env, tid in zip(chosen, ids):
        space = spaces.get(env)
        out.append(env_examples(env, [tid if space is None else space[0] + tid % (space[1] - space[0])], "train")[0])
    return out


def agent_eval_examples(envs: list[str], size: int,
                        spaces: dict[str, tuple[int, int] | None] | None = None) -> list[Example]:
    """``size`` held-out tasks per environment (at most the ``spaces[env]`` range holds, in order)."""
    out = []
    for env in envs:
        space = (spaces or {}).get(env)
        ids = eval_task_ids(size) if space is None else list(range(space[0], min(space[1], space[0] + size)))
        out += env_examples(env, ids, "eval")
    return out


def stage_envs(a: AgentCollectorConfig) -> list[list[str]]:
    """The environment set of every training stage (one stage unless ``stages`` is set)."""
    return [list(s["envs"]) for s in a.stages] if a.stages else [list(a.envs)]


def stage_of(a: AgentCollectorConfig, step: int) -> int:
    """Index of the stage that 0-indexed RL ``step`` belongs to (the last stage runs on to the end)."""
    end = 0
    for i, stage in enumerate(a.stages):
        end += int(stage["steps"])
        if step < end:
            return i
    return max(len(a.stages) - 1, 0)


# ----------------------------------------------------------------------------- clients and loop

def make_client(a: AgentCollectorConfig, env: str):
    """A client of ``env``: an AgentGym server's for ``agentgym:<name>``, credo's HTTP client when ``server_urls``
    names a server for it, else the environment in-process."""
    from credo.envs.agentgym import AgentGymClient, is_remote

    if is_remote(env):
        instruction = a.remote.instruction if env == remote_name(a) else None
        return AgentGymClient(a.server_urls[env], remote_adapter(a, env), instruction=instruction,
                              timeout_s=a.timeout_s, retries=a.retries, token=resolve_token("env"))
    if env in a.server_urls:  # the bearer token comes from $CREDO_ENV_TOKEN only (never from the saved config)
        return HTTPEnvClient(a.server_urls[env], env, timeout_s=a.timeout_s, retries=a.retries,
                             token=resolve_token("env"))
    return LocalEnvClient(env, **a.env_params.get(env, {}))


def run_envs(a: AgentCollectorConfig) -> list[str]:
    """Every environment the run trains or evaluates on."""
    return sorted({e for envs in stage_envs(a) for e in envs} | set(a.eval_envs))


def tool_mode(a: AgentCollectorConfig, tokenizer):
    """The structured-tools mode (credo.rollout.tool_episode.ToolMode) when the run's environments are tools environments
    (``EnvSpec.tools``), else None; ConfigError for a mix, branching or a tools environment behind a server."""
    from credo.rollout.tool_episode import ToolMode, choose_render
    from credo.tools.parsers import get_parser
    from credo.tools.render import CHAR_TOOL_TEMPLATE, ToolRenderer

    envs = run_envs(a)
    tooled = [e for e in envs if get_env_spec(e).tools]
    if not tooled:
        return None
    if len(tooled) != len(envs):
        raise ConfigError(f"structured-tools environments {tooled} cannot be mixed with action-tag ones "
                          f"{sorted(set(envs) - set(tooled))} in one run")
    if a.branching != "none" or set(tooled) & set(a.server_urls):
        raise ConfigError("structured-tools environments run in-process and without branching "
                          "(rollout.collector.branching=none, no server_urls for them)")
    own = a.tools.chat_template == "auto" and getattr(tokenizer, "chat_template", None)
    renderer = ToolRenderer(tokenizer, None if own else CHAR_TOOL_TEMPLATE)
    append_only, verdict = choose_render(renderer, a.tools.render)  # docs/templates.md
    return ToolMode(renderer, get_parser(a.tools.parser), append_only, verdict)


def make_template(a: AgentCollectorConfig, tokenizer) -> AgentTemplate:
    """The turn template ``template`` names (``auto``: the tokenizer's chat template when it has one); in a
    structured-tools run, the tool chat template's (:func:`tool_mode`)."""
    tools = tool_mode(a, tokenizer)
    if tools is not None:
        return tools.template()
    kind = a.template
    if kind == "auto":
        kind = "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    return chat_template(tokenizer) if kind == "chat" else plain_template(tokenizer)


def action_stop_sequences(a: AgentCollectorConfig, tokenizer) -> tuple[tuple[int, ...], ...]:
    """Token ids of every closing action tag of the run's environments (``stop_at_action``)."""
    if not a.stop_at_action:
        return ()
    tags = sorted({tag for env in run_envs(a) for tag in get_env_spec(env).parser.tags})
    return tuple(tuple(tokenizer(f"</{tag}>", add_special_tokens=False)["input_ids"]) for tag in tags)


def make_loop(a: AgentCollectorConfig, engine, tokenizer, *, max_turns: int) -> AgentLoop:
    """The multi-turn loop over ``engine`` with at most ``max_turns`` assistant turns per episode."""
    top_logprobs = int(a.branch_args.get("top_logprobs", 10)) if a.branching != "none" else 0
    tools = tool_mode(a, tokenizer)
    return AgentLoop(engine, tokenizer, tools.template() if tools else make_template(a, tokenizer), max_turns=max_turns,
                     max_tokens_per_turn=a.max_tokens_per_turn, max_response_tokens=a.max_response_tokens,
                     threads=a.threads, top_logprobs=top_logprobs, stop_sequences=action_stop_sequences(a, tokenizer),
                     max_total_tokens=getattr(engine.model_config, "max_position_embeddings", None), tools=tools,
                     kv_reuse=a.kv_reuse and engine.kv_sessions and (tools is None or tools.append_only))


def step_horizon(a: AgentCollectorConfig, step: int) -> int:
    """Turn cap at 0-indexed RL ``step`` (the schedule's formula uses 1-indexed steps)."""
    return horizon(step + 1, schedule=a.horizon_schedule, max_turns=a.max_turns, rounds=a.horizon_rounds,
                   period=a.horizon_period)


def eval_horizon(a: AgentCollectorConfig) -> int:
    """Turn cap at evaluation: ``eval_max_turns``, else the largest training horizon."""
    return a.eval_max_turns or max([a.max_turns, *a.horizon_rounds])


def run_episodes(a: AgentCollectorConfig, loop: AgentLoop, examples: list[Example], n: int, sampling: SamplingParams,
                 *, branching: str = "none", generator: torch.Generator | None = None, segments: bool = False):
    """(trajectories, rewards, branch stats): ``n`` episodes per example, plain or branched. ``segments``: a
    re-rendered episode's closed segments come before its row (``info["closed_segment"]``; docs/templates.md)."""
    group_ids = [g for g in range(len(examples)) for _ in range(n)]
    if branching != "none":
        return branched_rollouts(loop, examples, n, sampling, lambda ex: make_client(a, ex.meta["env"]),
                                 method=branching, generator=generator, **a.branch_args)
    reps = [ex for ex in examples for _ in range(n)]
    clients = [make_client(a, ex.meta["env"]) for ex in reps]
    try:
        episodes = loop.run(reps, clients, group_ids, sampling)
    finally:
        for c in clients:
            c.close()
    pairs = [p for ep in episodes for p in ((segment_trajectories(ep, loop.tokenizer) if segments else [])
                                            + [to_trajectory(ep, loop.tokenizer)])]
    return [p[0] for p in pairs], [p[1] for p in pairs], {}


def collect_agent_rollouts(opts: AgentOptions, engine, tokenizer, sampler, *, step: int, sampling: SamplingParams,
                           timer, guards=None) -> Rollouts:
    """One step's episodes: ``group_size`` per prompt of ``sampler`` at the step's horizon, shaped rewards, the
    episodes that failed in the environment dropped; structured-tools runs add the call metrics
    (``tools/*``). ``guards`` (credo.guards.Guards) checks ``tool_calls`` and ``env_failures``."""
    a = opts.collector
    max_turns = step_horizon(a, step)
    loop = make_loop(a, engine, tokenizer, max_turns=max_turns)
    loop.step = step  # credo/faults.py's generate point
    with timer("gen"):
        prompts = sampler.next_batch(opts.prompts_per_step)
        trajs, results, branch_stats = run_episodes(a, loop, prompts, opts.group_size, sampling,
                                                    branching=a.branching, generator=engine.generator, segments=True)
    trajs = [dataclasses.replace(t, policy_version=engine.policy_version) for t in trajs]
    finals = [i for i, t in enumerate(trajs) if "closed_segment" not in t.info]  # one per episode
    metrics = rollout_metrics(trajs, results) | episode_metrics([trajs[i] for i in finals], [results[i] for i in finals],
                                                                prefix="agent")
    metrics.update(group_diversity([trajs[i] for i in finals]))
    if loop.tools is not None:
        metrics.update(tool_metrics([trajs[i].info for i in finals]))
        metrics["render/rows_per_episode"] = len(trajs) / max(len(finals), 1)
        if guards is not None:
            agent_guards.check_tool_calls(guards, trajs, results, step=step)
    results = shape_rewards(results, trajs, turn_cost=a.turn_cost, invalid_action_cost=a.invalid_action_cost)
    check_env_failures(results, max_share=a.max_env_failure_share, step=step)
    every = results
    trajs, results, drop_metrics = drop_env_failures(trajs, results)
    if guards is not None:
        agent_guards.check_env_failures(guards, every, results, step=step)
    metrics.update(drop_metrics)
    metrics["agent/max_turns"] = max_turns
    metrics.update({f"agent/{k}": v for k, v in branch_stats.items()})
    return Rollouts(trajs, results, metrics, sampling=sampling)


class AgentCollector:
    """Multi-turn agent episodes (``rollout.collector.type=agent``): the prompts of the step's training stage
    (``stages``), the step's horizon, rewards from the environments placed as ``reward_placement`` says."""

    needs = CollectorNeeds()

    def __init__(self, opts: AgentOptions, engine, tokenizer, sampler, stage_samplers: list,
                 sampling: SamplingParams, guards=None) -> None:
        self.opts, self.engine, self.tokenizer, self.sampling = opts, engine, tokenizer, sampling
        self.sampler, self.stage_samplers, self.guards = sampler, stage_samplers, guards

    def start(self, run_dir: Path) -> None:
        """A structured-tools run records its render choice and template verdict (template_check.json)."""
        tools = tool_mode(self.opts.collector, self.tokenizer)
        if tools is not None:
            tools.record(run_dir)

    def collect(self, step: int, timer) -> Rollouts:
        sampler = self.stage_samplers[stage_of(self.opts.collector, step)] if self.stage_samplers else self.sampler
        return collect_agent_rollouts(self.opts, self.engine, self.tokenizer, sampler, step=step,
                                      sampling=self.sampling, timer=timer, guards=self.guards)

    def rewards(self, batch, trajs: list[Trajectory]) -> torch.Tensor:
        return reward_tensor(self.opts.collector, batch.scores, trajs, batch.responses.shape[1])

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(), "stage_samplers": [s.state_dict() for s in self.stage_samplers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        for sampler, st in zip(self.stage_samplers, state.get("stage_samplers") or []):
            sampler.load_state_dict(st)


def drop_env_failures(trajs: list[Trajectory], results: list[RewardResult]
                      ) -> tuple[list[Trajectory], list[RewardResult], dict[str, float]]:
    """The episodes to train on. An episode that failed in the environment (``RewardResult.failed``: the server
    erred, timed out or answered garbage) says nothing about the policy, so it is removed, and with it every group
    left with fewer than ``min(2, group size)`` valid episodes (one survivor has no group baseline). The kept
    groups are renumbered 0..K-1 in order, so group means and stds are over valid episodes only. Returns the kept
    trajectories and results and the metrics ``env/failed_episodes``, ``env/failed_share``,
    ``env/dropped_episodes`` (failed ones and their lone group mates) and ``env/dropped_groups``."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        groups[t.group_id].append(i)
    kept_trajs, kept_results, kept_groups = [], [], 0
    for rows in groups.values():
        valid = [i for i in rows if not results[i].failed]
        if len(valid) < min(2, len(rows)):
            continue
        kept_trajs += [dataclasses.replace(trajs[i], group_id=kept_groups) for i in valid]
        kept_results += [results[i] for i in valid]
        kept_groups += 1
    failed = sum(r.failed for r in results)
    return kept_trajs, kept_results, {"env/failed_episodes": failed, "env/failed_share": failed / max(len(results), 1),
                                      "env/dropped_episodes": len(trajs) - len(kept_trajs),
                                      "env/dropped_groups": len(groups) - kept_groups}


def check_env_failures(results: list[RewardResult], *, max_share: float, step: int) -> None:
    """Raise :class:`EnvOutageError` when more than ``max_share`` of the step's episodes failed in the environment
    (an outage is not a policy failure; training on the rest of a mostly failed batch would skew it); warn when
    any did."""
    failed = [r for r in results if r.failed]
    if not failed:
        return
    share = len(failed) / len(results)
    kinds = list(dict.fromkeys(" ".join(r.error.split())[:160] for r in failed))  # distinct, one line each
    if share > max_share:
        raise EnvOutageError(f"RL step {step + 1}: {len(failed)} of {len(results)} episodes failed in the environment "
                             f"({share:.0%} > rollout.collector.max_env_failure_share={max_share:g}); first error: {kinds[0]}")
    log.warning("RL step %d: %d of %d episodes failed in the environment and are left out of the update; errors: %s",
                step + 1, len(failed), len(results), " | ".join(kinds[:8]))


def shape_rewards(results: list[RewardResult], trajs: list[Trajectory], *, turn_cost: float,
                  invalid_action_cost: float) -> list[RewardResult]:
    """Training scores with optional costs: score - turn_cost * turns - invalid_action_cost * invalid actions.

    With an outcome reward alone, an episode that wanders (or emits unparseable turns) before it succeeds
    scores as much as a direct one, so GRPO reinforces its wasted turns too; a per-turn cost ranks direct
    successes above wandering ones. Off by default (the reference's pure outcome reward); success and
    evaluation are unaffected. Failed episodes (env errors) keep their failure score.
    """
    if not turn_cost and not invalid_action_cost:
        return results
    out = []
    for r, t in zip(results, trajs):
        cost = 0.0 if r.failed else turn_cost * t.info["num_turns"] + invalid_action_cost * t.info["invalid_actions"]
        out.append(dataclasses.replace(r, score=r.score - cost))
    return out


def _share(reused: int, prefilled: int) -> float:
    return reused / (reused + prefilled) if reused + prefilled else 0.0


def episode_metrics(trajs: list[Trajectory], results: list[RewardResult], prefix: str) -> dict[str, float]:
    n = max(len(trajs), 1)
    turn_tokens = [e - s for t in trajs for s, e in t.turns]
    out = {
        f"{prefix}/success_rate": sum(r.correct for r in results) / n,
        f"{prefix}/turns_mean": sum(t.info["num_turns"] for t in trajs) / n,
        f"{prefix}/tool_calls_mean": sum(t.info["tool_calls"] for t in trajs) / n,
        f"{prefix}/invalid_actions_mean": sum(t.info["invalid_actions"] for t in trajs) / n,
        f"{prefix}/env_failures": sum(bool(t.info["env_failure"]) for t in trajs),
        f"{prefix}/tokens_per_turn": statistics.fmean(turn_tokens) if turn_tokens else 0.0,
        f"{prefix}/cut_by_horizon": sum(t.info["cut"] == "max_turns" for t in trajs) / n,
        f"{prefix}/cut_by_length": sum(t.info["cut"] in ("max_response_tokens", "max_positions") for t in trajs) / n,
        # per episode: tokens prefilled over its turns, and the share of its turns' prefixes read from its KV session
        f"{prefix}/prefill_tokens": sum(t.info.get("prefill_tokens", 0) for t in trajs) / n,
        f"{prefix}/kv_reused_frac": _share(sum(t.info.get("kv_reused_tokens", 0) for t in trajs),
                                           sum(t.info.get("prefill_tokens", 0) for t in trajs)),
    }
    by_env: dict[str, list[bool]] = defaultdict(list)
    for r, t in zip(results, trajs):
        by_env[t.info["env"]].append(r.correct)
    if len(by_env) > 1:
        out.update({f"{prefix}/{env}/success_rate": sum(v) / len(v) for env, v in by_env.items()})
    return out


def group_diversity(trajs: list[Trajectory]) -> dict[str, float]:
    """How different a prompt's episodes are (what branching rollouts spend their budget on; docs/agents.md
    "Metrics and report"), averaged over the step's groups: ``agent/distinct_episodes_per_group`` (distinct
    response token sequences: every generated turn and observation), ``agent/distinct_answers_per_group``
    (distinct final assistant turns) and ``agent/distinct_share`` (distinct episodes over the group's size)."""
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[t.group_id].append(t)
    if not groups:
        return {}
    episodes, answers, share = [], [], []
    for rows in groups.values():
        distinct = len({tuple(t.response_ids) for t in rows})
        episodes.append(distinct)
        answers.append(len({tuple(t.response_ids[t.turns[-1][0]:t.turns[-1][1]]) if t.turns else () for t in rows}))
        share.append(distinct / len(rows))
    return {"agent/distinct_episodes_per_group": statistics.fmean(episodes),
            "agent/distinct_answers_per_group": statistics.fmean(answers),
            "agent/distinct_share": statistics.fmean(share)}


# ----------------------------------------------------------------------------- evaluation

def evaluate_agent(opts: AgentOptions, engine, tokenizer, examples: list[Example], *, seed: int,
                   samples_path: Path | None = None) -> dict[str, float]:
    """Held-out success: greedy (one episode per task) and avg@k / pass@k of k sampled episodes; per env too.
    The greedy episodes (prompt, whole transcript, reward, turns, failure) go to ``samples_path`` as JSONL."""
    a = opts.collector
    loop = make_loop(a, engine, tokenizer, max_turns=eval_horizon(a))
    greedy = SamplingParams(greedy=True)
    g_trajs, g_res, _ = run_episodes(a, loop, examples, 1, greedy)
    if samples_path is not None:
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"uid": t.example.uid, "env": t.info["env"], "response": t.response_text, "score": r.score,
                 "prompt": tokenizer.decode(t.prompt_ids, skip_special_tokens=True), "correct": r.correct,
                 "turns": t.info["num_turns"], "cut": t.info["cut"], "error": r.error} for t, r in zip(g_trajs, g_res)]
        atomic_write_text(samples_path, "".join(json.dumps(row) + "\n" for row in rows))
    k = opts.eval_k
    s_trajs, s_res, _ = run_episodes(a, loop, examples, k, SamplingParams(temperature=opts.eval_temperature,
                                                                          seed=seed))
    correct = [r.correct for r in s_res]
    out = {"eval/greedy_acc": sum(r.correct for r in g_res) / max(len(g_res), 1),
           f"eval/avg@{k}": sum(correct) / max(len(correct), 1),
           f"eval/pass@{k}": sum(any(correct[i * k:(i + 1) * k]) for i in range(len(examples))) / max(len(examples), 1),
           "eval/turns_mean": sum(t.info["num_turns"] for t in g_trajs) / max(len(g_trajs), 1),
           "eval/env_failures": sum(r.failed for r in g_res + s_res)}
    if loop.tools is not None:  # eval/tools/calls_attempted ... of the greedy episodes
        out.update(tool_metrics([t.info for t in g_trajs], prefix="eval/tools"))
    envs = sorted({ex.meta["env"] for ex in examples})
    for env in envs if len(envs) > 1 else []:
        rows = [r.correct for t, r in zip(g_trajs, g_res) if t.info["env"] == env]
        out[f"eval/{env}/greedy_success"] = sum(rows) / max(len(rows), 1)
    return out | group_success(a, g_trajs, g_res, "greedy_success") | group_success(a, s_trajs, s_res, f"avg@{k}")


def group_success(a: AgentCollectorConfig, trajs: list[Trajectory], results: list[RewardResult], name: str
                  ) -> dict[str, float]:
    """``eval/<env>/<label>/<name>``: success per label of the environments with a ``task_group`` (toolgraph's
    tiers), over the episodes of each label."""
    from credo.envs import check_env_params

    rows: dict[str, list[bool]] = defaultdict(list)
    for t, r in zip(trajs, results):
        env = t.example.meta["env"]
        group = get_env_spec(env).task_group
        if group is not None:
            label = group(check_env_params(env, a.env_params.get(env, {})), int(t.example.meta["task_id"]))
            rows[f"eval/{env}/{label}/{name}"].append(r.correct)
    return {key: sum(v) / len(v) for key, v in sorted(rows.items())}


# ----------------------------------------------------------------------------- oracle demonstrations

def oracle_batch(a: AgentCollectorConfig, tokenizer, examples: list[Example]):
    """A TrainBatch of oracle episodes (assistant turns mask 1, observations mask 0) for the SFT warm start."""
    template = make_template(a, tokenizer)
    trajs = [oracle_trajectory(a, tokenizer, template, ex) for ex in examples]
    return collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tokenizer.pad_token_id)


def oracle_trajectory(a: AgentCollectorConfig, tokenizer, template: AgentTemplate, ex: Example) -> Trajectory:
    """One episode of the environment's oracle on task ``ex``, at most the evaluation horizon long; the instance is
    closed afterwards (an HTTP one would otherwise stay open on its server)."""
    env_name = ex.meta["env"]
    client = LocalEnvClient(env_name, **a.env_params.get(env_name, {}))
    try:
        tools = tool_mode(a, tokenizer)
        if tools is not None:  # the structured-tools format (credo.rollout.tool_episode)
            return oracle_episode(tools, tokenizer, client, get_env_spec(env_name).oracle, ex, eval_horizon(a))
        return _oracle_episode(a, tokenizer, template, ex, client)
    finally:
        client.close()


def _oracle_episode(a: AgentCollectorConfig, tokenizer, template: AgentTemplate, ex: Example, client) -> Trajectory:
    spec = get_env_spec(ex.meta["env"])
    obs = client.reset(int(ex.meta["task_id"]))
    prompt = template.prompt(client.instruction, obs)
    ids: list[int] = []
    mask: list[int] = []
    turns = []
    for _ in range(eval_horizon(a)):
        action = list(tokenizer(spec.oracle(client.env, obs), add_special_tokens=False)["input_ids"])
        ids += template.assistant_prefix
        mask += [0] * len(template.assistant_prefix)
        own = action if a.stop_at_action else action + [template.end_of_turn]
        turns.append((len(ids), len(ids) + len(own)))
        ids += own
        mask += [1] * len(own)
        if a.stop_at_action:
            ids += template.close_turn
            mask += [0] * len(template.close_turn)
        result = client.step(tokenizer.decode(action))
        if result.done:
            break
        obs = result.observation
        obs_ids = template.observation(obs)
        ids += obs_ids
        mask += [0] * len(obs_ids)
    return Trajectory(example=ex, group_id=0, prompt_ids=prompt, response_ids=ids, rollout_logprobs=[0.0] * len(ids),
                      response_mask=mask, finish_reason="eos", turns=turns)


def reward_tensor(a: AgentCollectorConfig, scores: torch.Tensor, trajs: list[Trajectory], response_len: int
                  ) -> torch.Tensor:
    """Rewards for the estimator: scores (B,) for the default placement (last action token), or (B, T) token
    rewards on the last response token for the AgentGym-RL reference placement."""
    if a.reward_placement == "last_action":
        return scores
    out = torch.zeros(len(trajs), response_len)
    for i, t in enumerate(trajs):
        out[i, max(len(t.response_ids) - 1, 0)] = scores[i]
    return out


def agent_task_data(opts: AgentOptions, seed: int):
    """TaskData of environment tasks: a training mixture (per stage when ``stages`` is set) and held-out
    evaluation tasks of every evaluated environment."""
    from credo.data.source import TaskData

    a = opts.collector
    data_seed = opts.task_seed if opts.task_seed is not None else seed
    stages = stage_envs(a)
    every = sorted({e for envs in stages for e in envs} | set(a.eval_envs))
    train_spaces = {env: task_space(a, env, "train") for env in every}
    stage_train = [agent_train_examples(envs, a.env_weights if not a.stages else None, opts.train_size,
                                        data_seed + i, train_spaces)
                   for i, envs in enumerate(stages)]
    eval_envs = a.eval_envs or sorted({env for envs in stages for env in envs})
    train = [ex for exs in stage_train for ex in exs] if a.stages else stage_train[0]  # warm start sees every stage
    return TaskData(name="agent:" + "+".join(sorted({e for envs in stages for e in envs})), train=train,
                    eval=agent_eval_examples(eval_envs, opts.eval_size, {env: task_space(a, env, "eval") for env in every}),
                    default_reward=None, demonstration=None,
                    sft_batch=lambda tokenizer, exs: oracle_batch(a, tokenizer, exs),
                    stage_train=stage_train if a.stages else [])
