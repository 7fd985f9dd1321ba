"""docs/distributed.md's "Two nodes on one machine": a head (`ray start --head --node-ip-address 127.0.0.1`) and a
second node joining it on loopback ports (two raylets, one machine), then
`credo train distributed.backend=ray distributed.ray_address=127.0.0.1:PORT distributed.ray_placement=spread`
with 2 trainer ranks and 2 rollout workers: Ray's actor table shows each kind on both nodes, and the run's
metrics match one process."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from credo.distributed.ray_launch import CLUSTER_MODE_ENV  # noqa: E402

pytestmark = pytest.mark.ray  # starts a Ray cluster: the ray tier (python -m pytest -m ray)

COMMON = ["train.steps=2", "train.prompts_per_step=8", "rollout.group_size=4", "eval.every=0", "eval.size=8",
          "checkpoint.every=0", "log.report=false", "log.tensorboard=false", "log.progress=false", "train.threads=1"]

# `ray start --address` refuses to join with Ray's cluster mode off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, what keeps
# Ray on 127.0.0.1), and with it on rewrites 127.0.0.1 to the machine's external address: the second node is
# started by Ray's own CLI with the join check passed and the loopback address kept (its processes inherit
# cluster mode off). docs/distributed.md shows the same line.
JOIN_ON_LOOPBACK = ("import sys; from ray._private import ray_constants as c, services as s; "
                    "c.ENABLE_RAY_CLUSTER = True; s.resolve_ip_for_localhost = lambda h: h; "
                    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()")

# the actor table (Ray's GCS; ray.util.state needs the dashboard, which is off): class name -> node ids, dead
# actors included (the run has ended and its actors are gone)
ACTOR_NODES = """
import collections, json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", log_to_driver=False)
nodes = collections.defaultdict(list)
for a in state.actors().values():
    nodes[a["ActorClassName"]].append(a["Address"]["NodeID"])
print(json.dumps({"nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]), "actors": nodes}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes():
    """Two Ray nodes on 127.0.0.1 (3 CPUs each), one session directory; every process of theirs is killed
    afterwards."""
    exe = shutil.which("ray")
    if exe is None or shutil.which("credo") is None:
        pytest.skip("the ray / credo console scripts are not on PATH")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray2", dir="/tmp")  # short: Unix socket paths inside it are limited to 107 bytes
    env = {**os.environ, CLUSTER_MODE_ENV: "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus=3", "--disable-usage-stats", f"--temp-dir={temp}"]
    try:
        started = time.monotonic()
        head = subprocess.run([exe, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                               "--include-dashboard=false", *common,
                               "--min-worker-port=21000", "--max-worker-port=21999"],
                              capture_output=True, text=True, env=env)
        assert head.returncode == 0, head.stderr[-2000:]
        # the second raylet: its own worker port range (the rest of its ports Ray picks free)
        node = subprocess.run([sys.executable, "-c", JOIN_ON_LOOPBACK, "start", f"--address=127.0.0.1:{port}",
                               "--node-ip-address=127.0.0.1", *common, "--min-worker-port=22000", "--max-worker-port=22999"],
                              capture_output=True, text=True, env=env)
        assert node.returncode == 0, node.stderr[-2000:]
        print(f"two nodes started in {time.monotonic() - started:.1f} s")
        yield f"127.0.0.1:{port}", env
    finally:
        _stop_cluster(temp, env["RAY_AUTH_TOKEN"])
        shutil.rmtree(temp, ignore_errors=True)


def _stop_cluster(temp: str, token: str) -> None:
    """Kill this cluster's processes only (their command lines name its temp dir, or their environment holds its
    token); `ray stop` would stop every Ray instance on the machine."""
    def ours() -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int(entry.name) != os.getpid() and (
                        temp.encode() in (entry / "cmdline").read_bytes()
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
    assert not ours(), "Ray processes of the test cluster are still running"


def _metrics(path: Path) -> list[dict]:
    return [r for r in map(json.loads, open(path)) if "reward/mean" in r]


def test_spread_run_puts_trainer_ranks_and_rollout_workers_on_both_nodes(tmp_path, two_nodes):
    address, env = two_nodes
    credo = shutil.which("credo")
    started = time.monotonic()
    dist = subprocess.run([credo, "train", *COMMON, f"output_dir={tmp_path}", "run_name=ray",
                           "distributed.backend=ray", f"distributed.ray_address={address}",
                           "distributed.ray_placement=spread", "distributed.world_size=2",
                           "distributed.rollout_workers=2", "distributed.reward_workers=1"],
                          capture_output=True, text=True, env=env)
    assert dist.returncode == 0, dist.stderr[-3000:]
    print(f"two-node run: {time.monotonic() - started:.1f} s")
    table = subprocess.run([sys.executable, "-c", ACTOR_NODES, address], capture_output=True, text=True, env=env)
    assert table.returncode == 0, table.stderr[-2000:]
    seen = json.loads(table.stdout.strip().splitlines()[-1])
    assert len(seen["nodes"]) == 2
    actors = seen["actors"]
    assert sorted(actors["TrainerRank"]) == seen["nodes"]  # one rank on each node
    assert sorted(actors["RolloutWorker"]) == seen["nodes"]  # one rollout worker on each node
    assert len(actors["RewardWorker"]) == 1 and actors["RewardWorker"][0] in seen["nodes"]
    # the driver logs where the ranks ran
    assert all(n in dist.stderr for n in seen["nodes"]), dist.stderr[-3000:]
    # the ranks on two nodes trained as one process does: same rewards, the same summed gradient on both ranks
    single = subprocess.run([credo, "train", *COMMON, f"output_dir={tmp_path}", "run_name=single"],
                            capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-2000:]
    one, two, rank1 = (_metrics(tmp_path / p / "metrics.jsonl") for p in ("single", "ray", "ray/rank1"))
    assert len(one) == len(two) == len(rank1) == 2
    for a, b, c in zip(one, two, rank1):
        assert a["reward/mean"] == b["reward/mean"] == c["reward/mean"]
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4, abs=1e-6)
        assert b["actor/grad_norm"] == c["actor/grad_norm"]
        assert b["rollout/policy_lag"] == 0


def test_ray_placement_options():
    from credo.distributed.ray_pools import scheduling

    assert scheduling("default") == {}
    assert scheduling("spread") == {"scheduling_strategy": "SPREAD"}
    with pytest.raises(ValueError, match="ray_placement"):
        scheduling("pack")
