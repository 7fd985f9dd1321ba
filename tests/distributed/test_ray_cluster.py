"""docs/distributed.md's single-node recipe, run: `ray start --head --node-ip-address 127.0.0.1`, then
`credo train ... distributed.backend=ray distributed.ray_address=127.0.0.1:PORT`
with 2 trainer ranks, 2 rollout workers and 2 reward workers, one of each kind of worker killed mid-step, against
the same command in one process."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from credo.distributed.ray_launch import CLUSTER_MODE_ENV  # noqa: E402

pytestmark = pytest.mark.ray  # starts a Ray cluster: the ray tier (python -m pytest -m ray)

COMMON = ["train.steps=3", "train.prompts_per_step=8", "rollout.group_size=4", "eval.every=0", "eval.size=8",
          "checkpoint.every=0", "log.report=false", "log.tensorboard=false", "log.progress=false", "train.threads=1"]


def _metrics(path: Path) -> list[dict]:
    return [r for r in map(json.loads, open(path)) if "reward/mean" in r]


@pytest.fixture(scope="module")
def ray_head():
    """A one-node cluster started the way the docs start one; stopped afterwards. Its session directory is short
    (a Unix socket path inside it may not exceed 107 bytes, which pytest's tmp_path can)."""
    exe = shutil.which("ray")
    if exe is None or shutil.which("credo") is None:
        pytest.skip("the ray / credo console scripts are not on PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    # bound to 127.0.0.1: without --node-ip-address (and with Ray's cluster mode on) Ray advertises and connects
    # to the machine's external address. The drivers join 127.0.0.1:PORT (not "auto", which could find another
    # cluster on a shared machine) with this cluster's own token (token authentication, not ~/.ray's token)
    env = {**os.environ, CLUSTER_MODE_ENV: "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    start = subprocess.run([exe, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=8",
                            "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
                           capture_output=True, text=True, env=env)
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}", env
    finally:
        _stop_cluster(temp, env["RAY_AUTH_TOKEN"])
        shutil.rmtree(temp, ignore_errors=True)


def _stop_cluster(temp: str, token: str) -> None:
    """Kill this cluster's processes only (their command lines name its temp dir, or their environment holds its
    token: Ray's agents rename themselves); `ray stop` would stop every Ray instance on the machine."""
    import signal
    import time

    def ours() -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and (temp.encode() in (entry / "cmdline").read_bytes()
                                             or token.encode() in (entry / "environ").read_bytes()):
                    pids.append(int(entry.name))
            except OSError:
                pass
        return pids

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(50):  # up to 10 s
            if not ours():
                return
            time.sleep(0.2)


def test_ray_run_with_dying_workers_matches_the_single_process_run(tmp_path, ray_head):
    address, env = ray_head
    """Rollout workers sample exactly what the single engine samples (per-row keyed draws), so rewards are equal;
    the 2-rank update changes only the float summation order (losses, gradient norms, final weights to float
    tolerance). Rollout worker 1 dies in the second step's generation and reward worker 0 in its third call;
    both are replaced, their shares re-queued, and the restarts logged."""
    credo = shutil.which("credo")
    single = subprocess.run([credo, "train", *COMMON, f"output_dir={tmp_path}", "run_name=single"],
                            capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-2000:]
    dist = subprocess.run([credo, "train", *COMMON, f"output_dir={tmp_path}", "run_name=ray",
                           "distributed.backend=ray", f"distributed.ray_address={address}",
                           "distributed.world_size=2", "distributed.rollout_workers=2", "distributed.reward_workers=2",
                           "distributed.inject_faults=[rollout:1:4, reward:0:3]"],
                          capture_output=True, text=True, env=env)
    assert dist.returncode == 0, dist.stderr[-3000:]
    one, two, rank1 = (_metrics(tmp_path / p / "metrics.jsonl") for p in ("single", "ray", "ray/rank1"))
    assert len(one) == len(two) == len(rank1) == 3
    assert any(r.get("actor/grad_norm", 0) > 0 for r in one)  # the updates did something
    for a, b, c in zip(one, two, rank1):
        for key in ("reward/mean", "response_length/mean", "eval/greedy_acc"):
            assert a.get(key) == b.get(key) == c.get(key), key
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4, abs=1e-6)
        assert b.get("actor/pg_loss", 0.0) == pytest.approx(a.get("actor/pg_loss", 0.0), abs=1e-6)
        assert b["actor/grad_norm"] == c["actor/grad_norm"]  # the ranks stepped the same summed gradient
        assert b["rollout/policy_lag"] == 0  # the workers served the trainer's weights of each step
    # a worker's generate calls: the step-0 evaluation's two (greedy, sampled), then one per step: its fourth call
    # is the second step's generation
    assert [r["dist/rollout_restarts"] for r in two] == [0, 1, 1]
    assert two[-1]["dist/reward_restarts"] == 1
    from safetensors.torch import load_file

    w1, w2 = (load_file(next((tmp_path / p / "final").glob("*.safetensors"))) for p in ("single", "ray"))
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-5, msg=name)
    final = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert final["final/eval/greedy_acc"] == json.loads((tmp_path / "single" / "summary.json").read_text())[
        "final/eval/greedy_acc"]


def test_ray_fsdp2_one_step_off_run_matches_the_single_process_run(tmp_path, ray_head):
    address, env = ray_head
    """FSDP2-sharded trainer ranks (the rollout workers get the gathered whole weights) in one-step-off mode: the
    same rewards, policy lags and (to float tolerance) gradient norms and final weights as one process in
    one-step-off mode."""
    credo = shutil.which("credo")
    common = [*COMMON, f"output_dir={tmp_path}", "rollout.one_step_off=true"]
    single = subprocess.run([credo, "train", *common, "run_name=single"], capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-2000:]
    dist = subprocess.run([credo, "train", *common, "run_name=ray", "distributed.backend=ray",
                           f"distributed.ray_address={address}", "distributed.world_size=2",
                           "distributed.rollout_workers=2", "distributed.strategy=fsdp2"],
                          capture_output=True, text=True, env=env)
    assert dist.returncode == 0, dist.stderr[-3000:]
    one, two = (_metrics(tmp_path / p / "metrics.jsonl") for p in ("single", "ray"))
    assert [r["rollout/policy_lag"] for r in two] == [0, 1, 1]
    for a, b in zip(one, two):
        assert a["reward/mean"] == b["reward/mean"] and a["rollout/policy_lag"] == b["rollout/policy_lag"]
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4, abs=1e-6)
    from safetensors.torch import load_file

    w1, w2 = (load_file(next((tmp_path / p / "final").glob("*.safetensors"))) for p in ("single", "ray"))
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-5, msg=name)


def test_one_ray_rank_equals_one_process(tmp_path):
    """issue 37's cross-mode equivalence: distributed.backend=ray with one trainer rank, one rollout worker and one
    reward worker (a private local Ray instance: ray_address null) trains exactly what one process trains: every
    metrics row (bar timings, perf/, Ray's own dist/ counters and the weight_sync guard's counter, which only the
    in-process engine logs) and the final weights bit for bit. It catches a worker that samples with another key
    stream or stale weights, a rank that rescales the gradient, or a reward split that reorders rows."""
    from safetensors.torch import load_file
    from tests.conftest import TINY_RUN

    credo = shutil.which("credo")
    if credo is None:
        pytest.skip("the credo console script is not on PATH")
    args = [*TINY_RUN, "train.steps=3", "eval.every=2", "checkpoint.every=0", "log.report=false",
            "reward.name=tests.reward_fixtures:length_score",  # rewards that vary within a group: real updates
            "log.tensorboard=false", "log.progress=false", f"output_dir={tmp_path}"]
    root = Path(__file__).resolve().parents[2]  # tests.reward_fixtures importable in the run and its workers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    single = subprocess.run([credo, "train", *args, "run_name=single"], capture_output=True, text=True, env=env,
                            cwd=root)
    assert single.returncode == 0, single.stderr[-2000:]
    ray_run = subprocess.run([credo, "train", *args, "run_name=ray", "distributed.backend=ray",
                              "distributed.world_size=1", "distributed.rollout_workers=1",
                              "distributed.reward_workers=1"], capture_output=True, text=True, timeout=300,
                             env=env, cwd=root)
    assert ray_run.returncode == 0, ray_run.stderr[-3000:]
    skip = ("timing_s/", "perf/", "dist/", "guard/weight_sync_trips")
    one, two = ([{k: v for k, v in r.items() if not k.startswith(skip)} for r in _metrics(tmp_path / p / "metrics.jsonl")]
                for p in ("single", "ray"))
    assert len(one) == 3 and one == two
    assert any(r.get("actor/grad_norm", 0) > 0 for r in one)  # the updates did something
    assert [r["dist/rollout_restarts"] for r in _metrics(tmp_path / "ray" / "metrics.jsonl")] == [0, 0, 0]  # via Ray
    w1, w2 = (load_file(tmp_path / p / "final" / "model.safetensors") for p in ("single", "ray"))
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    s1, s2 = (json.loads((tmp_path / p / "summary.json").read_text()) for p in ("single", "ray"))
    assert s1["final/eval/greedy_acc"] == s2["final/eval/greedy_acc"]
