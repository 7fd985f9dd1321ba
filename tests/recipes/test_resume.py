"""The resume matrix: for each case, ``credo train`` uninterrupted (``full``) and the same command interrupted at
the start of RL step ``stop_at`` (a KeyboardInterrupt out of ``rl_step``) then continued with ``--resume`` from its
last checkpoint (``cut``) log identical ``metrics.jsonl`` rows, timings aside; each case adds the checks of what
its checkpoint has to carry (a critic and its optimizer, a flow head, trees in flight, queued batches, a teacher's
absence, curriculum and horizon positions, LoRA adapters).

The cases a SIGKILL at every fault point covers with the same assertions moved to tests/resume/test_matrix.py (one-step-off,
bounded staleness with and without partial rollouts, AttnRL, LoRA: metrics rows, rollouts.jsonl and final weights);
the cases here add what the matrix does not run (a DVPO critic with a reward model, a flow critic, ARPO branching
with horizon schedules, AttnRL one-step-off, a curriculum, distillation, VEPO, rollout correction).

The two runs of a case are made once per test session by :func:`resume_runs` (tests/conftest.py's
``full_and_resumed_runs``: one uninterrupted run, one interrupted run, one resume), so a test elsewhere that needs
the same runs can ask for them instead of training again."""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from credo.cli.main import main
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY, TINY_COLD, TINY_RUN, full_and_resumed_runs

VOLATILE = ("timing_s/", "perf/")
QUIET = ["log.report=false", "log.tensorboard=false", "log.progress=false"]
LENGTH = "reward.name=tests.reward_fixtures:length_score"


def _rows(run: Path, volatile: tuple[str, ...] = VOLATILE, keep: Callable[[dict], bool] = lambda r: True
          ) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(volatile)} for r in read_metrics(run / "metrics.jsonl")
            if keep(r)]


@dataclasses.dataclass(frozen=True)
class Case:
    """``args(root)``: the ``credo train`` arguments (``root``: a folder for what the case prepares first, e.g. a
    reward model or a teacher); ``check(full, cut)``: the assertions on the two run directories."""
    args: Callable[[Path], list[str]]
    stop_at: int
    check: Callable[[Path, Path], None]
    marks: tuple = ()


# ----------------------------------------------------------------------------- critics


def _dvpo_rm_args(root: Path) -> list[str]:
    """A tiny reward model from `credo rm train`, then exact_match + 0.5 * RM with a DVPO critic."""
    rm_dir = root / "rm"
    assert main(["-q", "rm", "train", "--run-dir", str(rm_dir), "model.hidden_size=32", "model.intermediate_size=64",
                 "rm.steps=5", "rm.pairs=64", "rm.eval_pairs=8", "warm_start.steps=3", "warm_start.batch_size=8",
                 "log.tensorboard=false", "log.progress=false", "train.threads=1"]) == 0
    return [*TINY_RUN, "train.steps=2", "eval.every=0", *QUIET, "checkpoint.every=1", "log.rollouts_every=1",
            "algo.advantage=dvpo", "critic.head=quantile", "critic.head_args={heads: 2, quantiles: 30}",
            "critic.loss=dvpo",
            f"reward.mix=[{{name: reward_model, weight: 0.5, kwargs: {{path: {rm_dir / 'reward_model'}}}}}]"]


def _dvpo_rm_check(full: Path, cut: Path) -> None:
    """Interrupted in its second step and resumed from the step-1 checkpoint (critic and its optimizer included);
    every training reward is exact_match + 0.5 * the reward model's score."""
    from credo.models.value import HEAD_CONFIG
    from credo.rewards.rm_scoring import LocalRewardModel

    rows = _rows(full)
    assert rows == _rows(cut)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        for term in ("qr", "cvar", "upper", "mean_shift", "tail_shape", "curvature", "consistency"):
            assert math.isfinite(r[f"critic/dvpo_{term}"]), term
        assert "critic/vf_loss" in r and "critic/vf_clipfrac" not in r
    # each training reward = exact_match (0/1, = correct) + 0.5 * the reward model's raw score of the response
    samples = [json.loads(line) for line in (full / "rollouts.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 16
    rm = LocalRewardModel(full.parent / "rm" / "reward_model")
    rm_scores = rm.score([s["prompt"] for s in samples], [s["response"] for s in samples])
    for s, r in zip(samples, rm_scores):
        assert s["score"] == pytest.approx(float(s["correct"]) + 0.5 * r, abs=1e-5)
    assert any(abs(s["score"] - round(s["score"])) > 1e-4 for s in samples)  # not all 0/1: the RM part is dense
    spec = json.loads((full / "checkpoints" / "step_000002" / "critic" / HEAD_CONFIG).read_text())
    assert spec == {"kind": "quantile", "args": {"heads": 2, "quantiles": 30}}


def _dfpo_args(root: Path) -> list[str]:
    return ["--config", "dfpo", *TINY_RUN, "train.steps=2", "eval.every=0", *QUIET, "checkpoint.every=1", LENGTH,
            "reward.executor=inline", "critic.head_args={quantiles: 16, quantile_steps: 2, hidden: 16, proj_dim: 16}"]


def _dfpo_check(full: Path, cut: Path) -> None:
    """`credo train --config dfpo` (a flow critic), interrupted at step 1 and resumed from the step-1 checkpoint
    (the flow head and its optimizer included)."""
    from credo.methods.dfpo.flow_head import FlowField, FlowHead
    from credo.models.value import HEAD_CONFIG, ValueModel

    sig = 1 / (1 + math.exp(0.3))  # sigmoid(-0.3) = 0.425557... (tests/algo/test_dfpo.py's SIG)
    rows = _rows(full)
    assert rows == _rows(cut)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        for term in ("bcfm", "dcfm", "cvar", "upper", "tail_shape", "weight"):
            assert math.isfinite(r[f"critic/dfpo_{term}"]), term
    assert rows[1]["critic/dfpo_weight"] == pytest.approx(sig + 0.5, abs=1e-6)  # zero start: sigma = 1
    assert rows[2]["critic/dfpo_weight"] != rows[1]["critic/dfpo_weight"]  # the critic moved
    critic_dir = full / "checkpoints" / "step_000002" / "critic"
    spec = json.loads((critic_dir / HEAD_CONFIG).read_text())
    # the override replaces the preset's head_args: the head keeps its defaults for the rest
    assert spec == {"kind": "flow", "args": {"proj_dim": 16, "hidden": 16, "quantiles": 16, "quantile_steps": 2}}
    loaded = ValueModel.load(critic_dir)
    assert isinstance(loaded.value_head, FlowHead) and loaded.value_head.quantiles == 16
    assert isinstance(loaded.value_head(torch.randn(1, 2, loaded.backbone.config.hidden_size)), FlowField)


# ----------------------------------------------------------------------------- collectors and schedules


def _agent_args(root: Path) -> list[str]:
    """ScalingInter-RL horizons [2, 3] switching after step 2, mixture of two envs, ARPO branching."""
    from tests.collect.test_agent_e2e import AGENT_RUN

    return [*AGENT_RUN, "agent.envs=[calc, maze]", "agent.horizon_schedule=stepwise", "agent.horizon_rounds=[2, 3]",
            "agent.horizon_period=2", "agent.branching=arpo", "agent.branch_args={branch_on: any}", "train.steps=5",
            "checkpoint.every=2", "eval.every=2", "task.eval_size=2"]


def _agent_check(full: Path, cut: Path) -> None:
    a, b = _rows(full), _rows(cut)
    assert [r["step"] for r in b] == list(range(6))
    assert [r.get("agent/max_turns") for r in a] == [None, 2, 2, 3, 3, 3]  # h(s) = rounds[min((s-1)//2, 1)]
    assert a == b


def _attnrl_args(one_step_off: bool) -> Callable[[Path], list[str]]:
    return lambda root: ["--config", "attnrl", *TINY_RUN, "rollout.group_size=4", "train.steps=4",
                         "checkpoint.every=2", "eval.every=0", "log.report=false", "log.tensorboard=false",
                         "attnrl.max_prompts=6", LENGTH, f"rollout.one_step_off={str(one_step_off).lower()}"]


def _attnrl_check(one_step_off: bool) -> Callable[[Path, Path], None]:
    """The dynamic batch size, the running FCI mean (and in one-step-off mode the tree batch in flight) are saved
    with the checkpoint."""
    def check(full: Path, cut: Path) -> None:
        def rows(run):
            return _rows(run, keep=lambda r: "tree/prompts" in r)

        assert len(rows(full)) == 4 and rows(full) == rows(cut)
        assert len({r["tree/prompts"] for r in rows(full)}) > 1  # the batch size did move
        if one_step_off:
            assert [r["rollout/policy_lag"] for r in rows(full)] == [0, 1, 1, 1]
    return check


def _curriculum_args(root: Path) -> list[str]:
    """Levels [0, 4] switching every 2 batches, interrupted at step 3 (checkpoint at step 2, inside level 4's
    schedule position)."""
    return [*TINY_RUN, "task.name=rg:chain_sum", "task.train_size=16", "task.eval_size=4", "train.steps=4",
            "task.curriculum={levels: [0, 4], every: 2}", "checkpoint.every=2", "eval.every=0",
            "log.tensorboard=false", "log.report=false", "warm_start.steps=0",
            "reward.timeout_s=60"]  # a verifier worker's first call imports reasoning_gym: no timeout under load


def _curriculum_check(full: Path, cut: Path) -> None:
    a, b = _rows(full), _rows(cut)
    assert [r["step"] for r in b] == list(range(5)) and a == b


# ----------------------------------------------------------------------------- methods


def _distill_args(root: Path) -> list[str]:
    from credo.models import build_model, save_model

    model, tok = build_model(TINY, seed=3)
    save_model(model, tok, root / "teacher")
    return [*TINY_RUN, "log.progress=false", "log.report=false", "eval.every=0", "train.steps=4", "checkpoint.every=2",
            f"distill.teacher.path={root / 'teacher'}"]


def _distill_check(full: Path, cut: Path) -> None:
    a, b = _rows(full), _rows(cut)
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4] and "distill/reverse_kl" in b[4]
    assert a == b


def _vepo_args(root: Path) -> list[str]:
    return ["--config", "vepo", *TINY_COLD, "train.steps=3", "checkpoint.every=1", "eval.every=0", "log.report=false",
            "log.tensorboard=false", "warm_start.enabled=false", LENGTH]


def _vepo_check(full: Path, cut: Path) -> None:
    """Perturbations are keyed by (seed, step, row), not by a global RNG: a resumed run selects the same tokens."""
    assert _rows(full) == _rows(cut) and "vepo/jsd_mean" in _rows(full)[-1]


# ----------------------------------------------------------------------------- off-policy pipelines


def _correction_args(root: Path) -> list[str]:
    return [*TINY_RUN, "train.steps=5", "checkpoint.every=2", "eval.every=0", "log.report=false",
            "log.tensorboard=false", LENGTH, "algo.rollout_correction=token_truncate", "rollout.one_step_off=true",
            "rollout.off_policy_ratio=recompute"]


def _correction_check(full: Path, cut: Path) -> None:
    volatile = ("timing_s/", "perf/tokens_per_s", "perf/gen_tokens_per_s")
    a, b = _rows(full, volatile), _rows(cut, volatile)
    assert [r["step"] for r in b] == list(range(6))
    assert any(k.startswith("rollout_corr/") for k in a[-1])
    assert a == b


CASES: dict[str, Case] = {
    "dvpo_critic_rm_reward": Case(_dvpo_rm_args, 1, _dvpo_rm_check),
    "dfpo_flow_critic": Case(_dfpo_args, 1, _dfpo_check),
    "agent_stepwise_horizon_arpo": Case(_agent_args, 3, _agent_check),
    "attnrl_one_step_off": Case(_attnrl_args(True), 3, _attnrl_check(True)),
    "rg_curriculum": Case(_curriculum_args, 3, _curriculum_check),
    "distill": Case(_distill_args, 3, _distill_check),
    "vepo": Case(_vepo_args, 2, _vepo_check),
    "rollout_correction_one_step_off": Case(_correction_args, 3, _correction_check),
}

_RUNS: dict[str, tuple[Path, Path]] = {}


@pytest.fixture(scope="session")
def resume_runs(tmp_path_factory):
    """``resume_runs(name)`` -> (full, cut): case ``name``'s two run directories, made on the first request of the
    session (each xdist worker has its own session)."""
    def runs(name: str) -> tuple[Path, Path]:
        if name not in _RUNS:
            case = CASES[name]
            root = tmp_path_factory.mktemp(f"resume-{name}")
            args = case.args(root)
            with pytest.MonkeyPatch.context() as mp:
                _RUNS[name] = full_and_resumed_runs(root, mp, args, stop_at=case.stop_at)
        return _RUNS[name]
    return runs


@pytest.mark.parametrize("name", [pytest.param(name, marks=case.marks, id=name) for name, case in CASES.items()])
def test_interrupted_and_resumed_run_logs_what_the_uninterrupted_run_logs(name: str, resume_runs):
    full, cut = resume_runs(name)
    CASES[name].check(full, cut)
