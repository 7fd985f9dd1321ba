"""The kill-and-resume matrix (docs/guarantees.md, "Resume"): every collector and mode, killed with SIGKILL at each
fault point of credo/faults.py (``CREDO_KILL_AT``: mid-generation, mid-update, mid-checkpoint, between a checkpoint
and its ``latest`` pointer) in a ``python -m credo.cli.main train`` subprocess, then resumed with
``credo train --resume RUN``, ends as the uninterrupted run ended:

- the rows of ``metrics.jsonl`` (timings aside: tests/recipes/test_resume.py's VOLATILE),
- the final weights (every ``final/*.safetensors`` tensor, bit for bit in float32),
- the prompts consumed and what was trained on them (every row of ``rollouts.jsonl``, ``log.rollouts_every=1``:
  prompt and response tokens, scores, advantages, log-probs, policy versions), so an async mode's batches in flight
  at the kill were neither dropped nor trained twice.

Each cut run is also checked to have died where its point says (returncode -9 and what it left on disk).
The uninterrupted run of a mode is made once per session and shared by its kill points (:func:`full_run`).

Tiers: the :data:`DEFAULT` cells run in the default suite; every other cell is marked ``resume`` (deselected by
default; ``python -m pytest -m resume``, .ci/run's resume stage), the vLLM and Ray cells also ``vllm`` / ``ray``
(they run in those tiers' stages: ``-m 'resume and ray'``, ``-m 'resume and vllm'``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from credo.tracking.metrics import read_metrics
from tests.conftest import TINY_RUN
from tests.recipes.test_resume import LENGTH, QUIET, VOLATILE

REPO = Path(__file__).resolve().parents[2]
POINTS = ("generate", "update", "checkpoint", "latest")
KILLED = -signal.SIGKILL
RUN_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Mode:
    """``args(root)``: the ``credo train`` arguments (``root``: a folder for what the mode prepares first);
    ``steps``: train.steps (checkpoints every step); ``kills``: kill point -> its ``CREDO_KILL_AT`` value
    (:func:`kills`); ``check(full, cut)``: the mode's own assertions; ``python``: the interpreter;
    ``marks``: pytest marks of every cell (``cells``: per kill point)."""
    args: Callable[[Path], list[str]]
    kills: dict[str, str]
    check: Callable[[Path, Path], None] | None = None
    python: str = sys.executable
    marks: tuple = ()
    cells: dict[str, tuple] = dataclasses.field(default_factory=dict)
    volatile: tuple[str, ...] = ()  # more metrics that differ between identical runs (wall-clock durations)
    exact: bool = True  # False: two uninterrupted runs already differ (:func:`check_same_course`)
    in_actor: bool = False  # the run trains in a Ray actor: the kill takes the actor, the driver then fails (rc 1)


def kills(steps: int, *, generate: int | None = None, update: int | None = None) -> dict[str, str]:
    """The four points of a run of ``steps`` steps checkpointed every step: generation and update of RL step
    ``steps - 1`` (0-based: its row is ``steps``; the async modes' generation of that batch runs while an earlier
    step trains, after checkpoint 1), the last checkpoint's writing and its pointer (the resume starts from
    checkpoint ``steps - 1``)."""
    last = steps - 1
    return {"generate": f"generate@{last if generate is None else generate}",
            "update": f"update@{last if update is None else update}",
            "checkpoint": f"checkpoint@{steps}", "latest": f"latest@{steps}"}


COMMON = [*TINY_RUN, *QUIET, "eval.every=0", "checkpoint.every=1", "log.rollouts_every=1", "checkpoint.keep=3"]


def _args(*extra: str, steps: int) -> Callable[[Path], list[str]]:
    return lambda root: [*COMMON, f"train.steps={steps}", *extra]


def _replay_args(root: Path) -> list[str]:
    """RLEP from a pool file (every training prompt with 2 stored right answers), refreshed as the run goes."""
    from tests.methods.rlep.test_rlep import _reversal_pool

    _reversal_pool(root / "pool.jsonl", 64)
    return ["--config", "rlep", *COMMON, "train.steps=3", f"replay.pool={root / 'pool.jsonl'}", "replay.refresh=true"]


def _lora_args(root: Path) -> list[str]:
    from tests.models.test_lora import RUN

    return [*RUN, *COMMON[len(TINY_RUN):], "train.steps=3"]


def _policy_lag(lags: list[int]) -> Callable[[Path, Path], None]:
    """An async mode trains on batches of older policies: the lags are the schedule's (the async machinery ran)."""
    def check(full: Path, cut: Path) -> None:
        assert [r["rollout/policy_lag"] for r in rows(full) if "reward/mean" in r] == lags
    return check


def _critic_check(full: Path, cut: Path) -> None:
    """The critic is trained (and resumed with its optimizer): its loss is logged every step."""
    assert all("critic/vf_loss" in r for r in rows(full) if "reward/mean" in r)


def _tree_check(full: Path, cut: Path) -> None:
    """AttnRL's dynamic batch size moved (its running state is part of the checkpoint)."""
    steps = [r["tree/prompts"] for r in rows(full) if "tree/prompts" in r]
    assert len(steps) == 4 and len(set(steps)) > 1


def _replay_check(full: Path, cut: Path) -> None:
    """Every group got its 2 stored answers (the pool's draws and refreshed answers are in the rows compared; was
    tests/methods/rlep/test_rlep.py's resume half)."""
    steps = [r for r in rows(full) if "reward/mean" in r]
    assert len(steps) == 3
    for r in steps:
        assert r["replay/samples"] == 4 * 2 and r["replay/per_group"] == 2.0 and r["replay/short_groups"] == 0
        assert r["replay/positive_accuracy"] == 1.0 and r["reward/mean"] < 1.0  # the fresh samples' own metrics


def _agent_args(root: Path) -> list[str]:
    """Multi-turn episodes against `credo env serve calc` over HTTP (one server for the mode's runs)."""
    from tests.collect.test_agent_e2e import AGENT_RUN

    return [*AGENT_RUN, *COMMON[len(TINY_RUN):], "checkpoint.save_final=true", "train.steps=3",
            f"agent.server_urls={{calc: '{served('calc')}'}}"]


def _agent_check(full: Path, cut: Path) -> None:
    """The episodes reached the server (no env failure) and ran several turns."""
    steps = [r for r in rows(full) if "agent/env_failures" in r]
    assert len(steps) == 3 and all(r["agent/env_failures"] == 0 for r in steps)


def _gateway_args(root: Path) -> list[str]:
    """The gateway collector with a command agent (two calls per episode), scored by the run's verifier."""
    from tests.collect.test_gateway import CMD, GATEWAY_RUN

    return [*GATEWAY_RUN, *COMMON[len(TINY_RUN):], "checkpoint.save_final=true", "train.steps=3",
            f"rollout.collector.command='{CMD} null'", "reward.name=tests.collect.gateway_agents:dense_verifier"]


def _gateway_check(full: Path, cut: Path) -> None:
    assert all(r["gateway/episodes"] == 4 and r["gateway/failed_episodes"] == 0 for r in rows(full)
               if "gateway/episodes" in r)


_SERVERS = contextlib.ExitStack()
_URLS: dict[str, str] = {}


def served(name: str) -> str:
    """The URL of `credo env serve NAME` (tests/env_util.py), started on first use, stopped with the session."""
    if name not in _URLS:
        from tests.env_util import env_server

        _URLS[name] = _SERVERS.enter_context(env_server(name))[0]
    return _URLS[name]


@pytest.fixture(scope="session", autouse=True)
def _stop_servers():
    yield
    _SERVERS.close()


ASYNC = kills(4, generate=3)  # batch 3 is generated in the background while step 1 or 2 trains
EVAL_2 = ("eval.every=2",)  # an evaluation at step 2 waits for the batches in flight (they stay queued)

MODES: dict[str, Mode] = {
    "group": Mode(_args(LENGTH, steps=3), kills(3)),
    "one_step_off": Mode(_args(LENGTH, "rollout.one_step_off=true", *EVAL_2, steps=4), ASYNC,
                         _policy_lag([0, 1, 1, 1])),
    "staleness": Mode(_args(LENGTH, "rollout.max_staleness=2", *EVAL_2, steps=4), ASYNC, _policy_lag([0, 1, 2, 2])),
    "staleness_partial": Mode(_args(LENGTH, "rollout.max_staleness=2", "rollout.partial=true", *EVAL_2, steps=4),
                              ASYNC, _policy_lag([0, 1, 2, 2])),
    "critic": Mode(lambda root: ["--config", "ppo", *_args(LENGTH, steps=3)(root)], kills(3), _critic_check),
    "lora": Mode(_lora_args, kills(3)),
    "tree": Mode(lambda root: ["--config", "attnrl", *_args(LENGTH, "attnrl.max_prompts=6", steps=4)(root)],
                 kills(4), _tree_check),
    "replay": Mode(_replay_args, kills(3), _replay_check),
    "agent_http_env": Mode(_agent_args, kills(3), _agent_check),
    "gateway": Mode(_gateway_args, kills(3), _gateway_check, exact=False),  # check_same_course: the bound
    # vLLM's CPU build (float32), in its own venv: .ci/run's vLLM stage runs these cells with its python
    # (head_dim 32: the CPU build's attention has no kernel for the tiny model's 8)
    "vllm": Mode(_args(LENGTH, "rollout.engine=vllm", "rollout.vllm.dtype=float32", "model.hidden_size=128",
                       "model.intermediate_size=256", steps=3), kills(3),
                 marks=(pytest.mark.vllm,)),
    # one trainer rank, one Ray rollout worker and one Ray reward worker (a private local Ray instance); the points
    # are reached in the trainer rank's actor process, which the kill takes
    "ray_pool": Mode(_args(LENGTH, "distributed.backend=ray", "distributed.world_size=1",
                           "distributed.rollout_workers=1", "distributed.reward_workers=1", steps=3), kills(3),
                     marks=(pytest.mark.ray,), volatile=("dist/",), in_actor=True),
}

# the cells of the default suite (the others run in the resume tier only)
DEFAULT = {("group", p) for p in POINTS} | {("staleness_partial", "generate")}


# ----------------------------------------------------------------------------- running


def credo(python: str, args: list[str], *, kill_at: str | None = None, env: dict | None = None
          ) -> subprocess.CompletedProcess:
    """``python -m credo.cli.main -q ARGS`` in its own process group; with ``kill_at`` the run SIGKILLs itself
    there (credo/faults.py), and what it started and left behind (reward workers) is killed with its group."""
    # PYTHONPATH: the tests' reward functions importable in the run's worker processes (Ray's included)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    environ = {**os.environ, **(env or {}), "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    environ.pop("CREDO_KILL_AT", None)
    if kill_at is not None:
        environ["CREDO_KILL_AT"] = kill_at
    # output to a file, not a pipe: a killed run's engine processes (vLLM's) may hold a pipe open past its death
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([python, "-m", "credo.cli.main", "-q", *args], env=environ, stdout=log,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO)
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group's leftovers (the leader is gone or done)
            except ProcessLookupError:
                pass
            proc.wait()
        log.seek(0)
        out = log.read()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def rows(run: Path, file: str = "metrics.jsonl", volatile: tuple[str, ...] = ()) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith((*VOLATILE, *volatile))} for r in read_metrics(run / file)]


def final_tensors(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((run / "final").rglob("*.safetensors"))
    assert files, f"{run}/final holds no safetensors"
    return {f"{f.relative_to(run)}:{k}": v.float() for f in files for k, v in load_file(f).items()}


_FULL: dict[str, tuple[Path, list[str]]] = {}


@pytest.fixture(scope="session")
def full_run(tmp_path_factory):
    """``full_run(mode)`` -> (the uninterrupted run, the arguments): made on the first request of the session."""
    def run(name: str) -> tuple[Path, list[str]]:
        if name not in _FULL:
            mode = MODES[name]
            root = tmp_path_factory.mktemp(f"resume-{name}")
            args = mode.args(root)
            done = credo(mode.python, ["train", "--run-dir", str(root / "full"), *args])
            assert done.returncode == 0, done.stdout[-4000:]
            _FULL[name] = (root / "full", args)
        return _FULL[name]
    return run


def check_same_course(full: Path, cut: Path) -> None:
    """The bound of a mode whose sampled tokens differ between two uninterrupted runs (the gateway: concurrent
    agents' calls are batched by arrival time, and each engine call draws its own sampling key, so which tokens an
    episode samples depends on timing; docs/guarantees.md, "Resume"): the resumed run consumed the same prompts in
    the same steps and groups (nothing dropped or trained twice), logged the same metrics at the same steps and
    saved weights of the same names and shapes; the values that depend on the samples are not compared."""
    def prompts(run):
        return [(r["step"], r["uid"], r["prompt"], r["group"]) for r in read_metrics(run / "rollouts.jsonl")]

    assert prompts(cut) == prompts(full) and prompts(full)
    assert [(r["step"], sorted(r)) for r in rows(cut)] == [(r["step"], sorted(r)) for r in rows(full)]
    a, b = final_tensors(full), final_tensors(cut)
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}


def check_died_at(point: str, spec: str, cut: Path) -> None:
    """What the killed run left shows where it died."""
    step = int(spec.split("@")[1].split("#")[0])
    ckpts = cut / "checkpoints"
    logged = [r["step"] for r in read_metrics(cut / "metrics.jsonl") if "reward/mean" in r or "train/skipped_step" in r]
    assert not (cut / "final").exists()
    if point == "checkpoint":
        assert any(p.name.startswith(f".tmp-step_{step:06d}-") for p in ckpts.iterdir())
        assert not (ckpts / f"step_{step:06d}").exists()
    elif point == "latest":
        assert (ckpts / f"step_{step:06d}" / "COMPLETE").is_file()
        assert (ckpts / "latest").read_text().strip() == f"step_{step - 1:06d}"
    elif point == "update":
        assert max(logged, default=0) == step  # this step's row (step + 1) was not written
    else:  # generate: rows up to the step's, at most (async: the batch is generated ahead)
        assert max(logged, default=0) <= step


def _cells():
    for name, mode in MODES.items():
        for point in POINTS:
            if point not in mode.kills:
                continue
            tier = () if (name, point) in DEFAULT else (pytest.mark.resume,)
            # one xdist group per mode: its cells share its uninterrupted run, the modes spread over the workers
            marks = [*tier, pytest.mark.xdist_group(f"resume-{name}"), *mode.marks, *mode.cells.get(point, ())]
            yield pytest.param(name, point, marks=marks, id=f"{name}-{point}")


@pytest.mark.parametrize(("name", "point"), list(_cells()))
def test_killed_and_resumed_run_ends_as_the_uninterrupted_run(name: str, point: str, full_run, tmp_path):
    mode = MODES[name]
    full, args = full_run(name)
    cut, spec = tmp_path / "cut", mode.kills[point]
    died = credo(mode.python, ["train", "--run-dir", str(cut), *args], kill_at=spec)
    if mode.in_actor:  # SIGKILL of the trainer rank's actor process; the driver reports it and fails
        assert died.returncode == 1 and "actor died unexpectedly" in died.stdout, died.stdout[-4000:]
    else:
        assert died.returncode == KILLED, f"{spec} never reached (rc {died.returncode}):\n{died.stdout[-4000:]}"
    check_died_at(point, spec, cut)
    resumed = credo(mode.python, ["train", "--resume", str(cut)])
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    if mode.exact:
        assert rows(cut, volatile=mode.volatile) == rows(full, volatile=mode.volatile)
        assert rows(cut, "rollouts.jsonl") == rows(full, "rollouts.jsonl")
        a, b = final_tensors(full), final_tensors(cut)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    else:
        check_same_course(full, cut)
    if mode.check is not None:
        mode.check(full, cut)
