"""The multi-node templates of issue 36 item 6 (examples/slurm, examples/ray_cluster; NOT RUN on a cluster here,
docs/distributed.md "Multi-node"): the sbatch file is valid bash, and run with stand-ins for scontrol / srun /
torchrun / credo it hands every rank `credo train` with the template's overrides, its own GPU as
CUDA_VISIBLE_DEVICES=$LOCAL_RANK and the rendezvous on the first node. The Ray recipe's credo command parses."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "examples" / "slurm" / "credo_ddp.sbatch"
RAY_README = REPO / "examples" / "ray_cluster" / "README.md"

FAKES = {
    # scontrol: the two nodes, then many more lines than a pipe buffer holds, so that a template reading only the
    # first line through `| head -n 1` under pipefail dies of SIGPIPE (exit 141) every time, not by chance (the
    # CI failure of 3df7b50); a real allocation of thousands of nodes prints as much
    "scontrol": 'echo node-a; echo node-b; for i in $(seq 20000); do echo node-x$i; done',
    # srun: drop its options, run the command once as node 1 of 2
    "srun": 'while [[ $1 == --* ]]; do shift; done; SLURM_NNODES=2 SLURM_NODEID=1 exec "$@"',
    # torchrun: record its options, start "rank" LOCAL_RANK=3 of the command after --no-python
    "torchrun": 'opts=(); while [[ $1 != --no-python ]]; do opts+=("$1"); shift; done; shift; '
                'echo "torchrun ${opts[*]}" >> "$LOG"; LOCAL_RANK=3 exec "$@"',
    "credo": 'echo "credo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES $*" >> "$LOG"',
}


def test_sbatch_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_sbatch_hands_each_rank_credo_train_on_its_own_gpu(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log), "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "node-[a-b],node-x[1-20000]", "CREDO_DIR": str(tmp_path), "VENV": str(venv),
           "RUN_DIR": "/shared/runs/x y"}
    proc = subprocess.run(["bash", str(SBATCH), "train.steps=5", "rollout.group_size=16"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    torchrun, credo = log.read_text().splitlines()
    assert "--nnodes=2 --node-rank=1 --nproc-per-node=8" in torchrun
    assert "--rdzv-endpoint=node-a:29500" in torchrun and "--rdzv-id=42" in torchrun
    assert credo.startswith("credo CUDA_VISIBLE_DEVICES=3 train --run-dir /shared/runs/x y --config grpo ")
    args = credo.split(" train ", 1)[1]
    for want in ["model.device=cuda", "distributed.backend=torchrun", "distributed.comm=nccl",
                 "distributed.strategy=fsdp2", "train.steps=5", "rollout.group_size=16"]:
        assert want in args.split(), (want, args)


def test_ray_recipe_credo_command_is_a_valid_config():
    from credo.config import load_config

    text = RAY_README.read_text()
    assert "not run here" in text.lower()
    block = re.search(r"```bash\n(credo train .*?)\n```", text, re.S)
    assert block, "the README's credo train block"
    words = shlex.split(block.group(1).replace("\\\n", " "))
    overrides = [w.replace("HEAD_IP:6379", "10.0.0.1:6379") for w in words[2:] if "=" in w and not w.startswith("-")]
    cfg = load_config("grpo", overrides)
    assert cfg.distributed.backend == "ray" and cfg.distributed.ray_address == "10.0.0.1:6379"
