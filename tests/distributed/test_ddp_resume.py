"""Kill-and-resume of a data-parallel run (`torchrun --nproc-per-node 2`, gloo on the CPU, distributed.strategy=ddp):
the run interrupted at the start of RL step 2 and continued with ``credo train --resume`` logs the uninterrupted
run's metrics on both ranks and ends with its final weights; every rank restores rank 0's weights (rank 1's
checkpoint ``model/`` holds only the tokenizer) and its own optimizer, RNG and sampler state. A resume on another
number of ranks is refused in one line (docs/distributed.md, "Resuming a torchrun run").

The "kill" is tests/distributed/stop_at_step.py: ``credo train`` with RL step ``CREDO_TEST_STOP_AT`` interrupted by
a KeyboardInterrupt on every rank (as tests/conftest.py's ``full_and_resumed_runs`` does in one process)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.stop_at_step import TINY_MODEL, rows as _rows

REPO = Path(__file__).resolve().parents[2]
STOP_AT_STEP = Path(__file__).with_name("stop_at_step.py")  # credo train, interrupted at a step


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_ddp_run_killed_and_resumed_matches_the_uninterrupted_run(tmp_path):
    from safetensors.torch import load_file

    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    if credo is None or torchrun is None:
        pytest.skip("the credo / torchrun console scripts are not on PATH")
    common = ["train.steps=4", "train.prompts_per_step=8", "rollout.group_size=4", "eval.every=2", "eval.size=8",
              "checkpoint.every=1", "checkpoint.keep=2", "log.report=false", "log.tensorboard=false",
              "log.progress=false", "train.threads=1", f"output_dir={tmp_path}", *TINY_MODEL,
              "reward.name=tests.reward_fixtures:length_score", "distributed.backend=torchrun",
              "distributed.rollout=replicate", "distributed.strategy=ddp"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    two = [torchrun, "--standalone", "--nproc-per-node", "2"]  # a free port: other tests run torchrun at once
    full = _run([*two, "--no-python", credo, "train", *common, "run_name=full"], env)
    assert full.returncode == 0, full.stderr[-3000:]
    cut = _run([*two, "--no-python", sys.executable, str(STOP_AT_STEP), "train", *common, "run_name=cut"], {**env, "CREDO_TEST_STOP_AT": "2"})
    assert cut.returncode != 0, cut.stderr[-3000:]
    assert "KeyboardInterrupt" in cut.stderr or "interrupted" in cut.stderr, cut.stderr[-3000:]
    ckpts = tmp_path / "cut" / "rank1" / "checkpoints" / "step_000002"
    assert (ckpts / "model" / "tokenizer_config.json").is_file()
    assert not list((ckpts / "model").glob("*.safetensors"))  # rank 1 saves no weights: it loads rank 0's
    assert len(_rows(tmp_path / "cut" / "metrics.jsonl")) == 3  # steps 0-2, then the kill

    # another number of ranks is refused, in one line, before anything trains
    shutil.copytree(tmp_path / "cut", tmp_path / "copy")  # (a resume's overrides are written to its config.yaml)
    one = _run([credo, "train", "--resume", str(tmp_path / "copy"), "distributed.backend=none"], env)
    assert one.returncode != 0
    assert "was written by a run on 2 ranks; resuming it on 1 is not supported" in one.stderr, one.stderr[-2000:]

    resumed = _run([*two, "--no-python", credo, "train", "--resume", str(tmp_path / "cut")], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rel in ("metrics.jsonl", "rank1/metrics.jsonl"):
        want, got = _rows(tmp_path / "full" / rel), _rows(tmp_path / "cut" / rel)
        assert [r["step"] for r in want] == [0, 1, 2, 3, 4]
        assert any(r.get("actor/grad_norm", 0) > 0 for r in want[3:])  # the resumed steps moved the weights
        assert got == want, rel
    w_full, w_cut = (load_file(next((tmp_path / p / "final").glob("*.safetensors"))) for p in ("full", "cut"))
    assert w_full.keys() == w_cut.keys()
    for name in w_full:
        torch.testing.assert_close(w_cut[name], w_full[name], rtol=0, atol=0, msg=name)


def _fake_checkpoint(root: Path, step: int) -> None:
    """An intact checkpoint as far as credo.train.checkpoint.checkpoint_problem can tell (files, manifest, marker)."""
    from credo.train.checkpoint import COMPLETE, write_manifest

    ckpt = root / "checkpoints" / f"step_{step:06d}"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "config.json").write_text("{}")
    write_manifest(ckpt)
    (ckpt / COMPLETE).write_text(ckpt.name)
    (root / "checkpoints" / "latest").write_text(ckpt.name)


def _agree_worker(rank: int, init_file: str, run: str, out: str) -> None:
    import torch.distributed as dist

    from credo.distributed.launch import agree_on_checkpoint
    from credo.train.checkpoint import resume_checkpoint
    from credo.train.data_parallel import DataParallel

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        own_dir = Path(run) / (f"rank{rank}" if rank else "")
        try:
            got = [str(p) for p in agree_on_checkpoint(DataParallel(rank, 2), own_dir, resume_checkpoint(own_dir))]
        except (FileNotFoundError, ValueError) as exc:
            got = [f"{type(exc).__name__}: {exc}"]
        Path(out, f"{rank}.json").write_text(json.dumps(got))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _agree(tmp_path: Path, run: Path) -> list[list[str]]:
    import torch.multiprocessing as mp

    out = tmp_path / f"out-{run.name}"
    out.mkdir()
    mp.start_processes(_agree_worker, args=(str(out / "init"), str(run), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    return [json.loads((out / f"{r}.json").read_text()) for r in range(2)]


def test_ranks_agree_on_the_oldest_newest_checkpoint_and_load_rank_0s_weights(tmp_path):
    """Rank 0 killed after its step-2 checkpoint, rank 1 before its own: both resume step 1, rank 1 with rank 0's
    weights; a rank without any checkpoint (a run started on fewer ranks) stops every rank in one line, and a
    single process refuses a 2-rank run's checkpoint."""
    from credo.distributed.launch import agree_on_checkpoint
    from credo.train.data_parallel import LOCAL

    ahead = tmp_path / "ahead"
    for step in (1, 2):
        _fake_checkpoint(ahead, step)
    _fake_checkpoint(ahead / "rank1", 1)
    r0, r1 = _agree(tmp_path, ahead)
    step1 = str(ahead / "checkpoints" / "step_000001")
    assert r0 == [step1, step1]
    assert r1 == [str(ahead / "rank1" / "checkpoints" / "step_000001"), step1]

    fewer = tmp_path / "fewer"
    _fake_checkpoint(fewer, 1)
    (fewer / "rank1").mkdir()
    for got in _agree(tmp_path, fewer):
        assert got[0].startswith("FileNotFoundError: cannot resume: rank(s) [1] have no intact checkpoint"), got

    ckpt = ahead / "checkpoints" / "step_000001"  # rank 1 wrote it too
    assert agree_on_checkpoint(LOCAL, ahead / "rank1", None) == (None, None)
    with pytest.raises(ValueError, match="written by a run on 2 ranks; resuming it on 1 is not supported"):
        agree_on_checkpoint(LOCAL, ahead, ckpt)
