"""`credo train`, `credo eval` and `credo export` on a model and a dataset named by hub id, through the real CLI
(``python -m credo.cli.main`` in a fresh process), with the hub offline: HF_HUB_CACHE points at a hub cache
written on disk in huggingface_hub's layout (tests/hub_util.py), HF_HUB_OFFLINE=1, and HF_HOME in tmp_path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.hub_util import add_dataset, add_model_dir, save_tiny_model

REPO = Path(__file__).resolve().parents[2]
TINY = ["task.train_size=64", "task.eval_size=8", "rollout.group_size=4", "train.prompts_per_step=4",
        "rollout.max_new_tokens=8", "warm_start.enabled=false", "eval.k=2", "reward.workers=1", "train.threads=1",
        "train.steps=2", "eval.every=0", "checkpoint.every=1"]
ROWS = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(24)]
ROWS[5] = {"question": "What is five?", "answer": "five"}  # no '#### n': a bad row for answer_transform=gsm8k


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """org/tiny (tag v1: seed 0; main: seed 1) and org/sums (subset main: train, test) in a hub cache; the
    environment of an offline user of that cache."""
    root = tmp_path_factory.mktemp("hubcli")
    cache = root / "home" / "hub"
    v1 = add_model_dir(cache, "org/tiny", save_tiny_model(root / "m0", seed=0), ref="v1", tag="a")
    main = add_model_dir(cache, "org/tiny", save_tiny_model(root / "m1", seed=1), ref="main", tag="b")
    sums = add_dataset(cache, "org/sums", {"train": ROWS, "test": ROWS[:8]})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(root / "home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CREDO_DEBUG="0",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p))
    return {"root": root, "cache": cache, "env": env, "v1": v1, "main": main, "sums": sums}


def credo(hub, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", *args], cwd=hub["root"], env=hub["env"],
                          capture_output=True, text=True, timeout=600)


DATA = ["task.name=hf", "task.dataset=org/sums", "task.subset=main", "task.prompt_field=question",
        "task.answer_transform=gsm8k", "task.eval_split=test", "reward.name=number"]


@pytest.fixture(scope="module")
def run(hub):
    """One `credo train` of org/tiny@v1 on org/sums (one bad row in each split)."""
    out = credo(hub, "train", "--run-dir", str(hub["root"] / "run"), "model.path=org/tiny@v1", *DATA, *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    return hub["root"] / "run", out


def test_train_by_hub_ids_pins_the_snapshots_and_counts_the_bad_rows(hub, run):
    run_dir, out = run
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["model"]["path"] == f"org/tiny@{hub['v1']}"  # the tag resolved to its commit: a resume reads it
    assert cfg["task"]["dataset"] == f"org/sums@{hub['sums']}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data/bad_rows"] == 2  # row 5 of train and of test
    assert "org/sums[train]: skipped 1 of 24 rows: org/sums[train]:5: field 'answer': answer_transform=gsm8k" \
        in out.stderr
    assert "Traceback" not in out.stderr
    assert (run_dir / "final" / "config.json").is_file()


def test_eval_by_hub_id_and_revision(hub):
    out = credo(hub, "eval", f"org/tiny@{hub['v1']}", *DATA, "task.eval_size=4", "eval.k=1",
                "rollout.max_new_tokens=4", "reward.workers=1")
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(out.stdout)
    assert metrics["model"] == str(hub["cache"] / "models--org--tiny" / "snapshots" / hub["v1"])
    assert metrics["examples"] == 7  # the test split's 8 rows less its bad one


def test_export_records_the_hub_snapshot_the_run_started_from(hub, run):
    run_dir, _ = run
    out = credo(hub, "export", str(run_dir), "--out", str(hub["root"] / "exported"))
    assert out.returncode == 0, out.stderr[-3000:]
    exported = hub["root"] / "exported"
    assert (exported / "model.safetensors").is_file() and (exported / "config.json").is_file()
    assert json.loads((exported / "credo_base_model.json").read_text()) == {"repo_id": "org/tiny",
                                                                           "revision": hub["v1"]}


@pytest.mark.parametrize("args, words", [
    (["train", "model.path=org/missing@v7"], ["model.path: org/missing@v7 is not a Hugging Face model directory",
                                              "org/missing at revision v7 is not in", "HF_HUB_OFFLINE=1",
                                              "`hf download org/missing --revision v7`"]),
    (["train", "task.name=hf", "task.dataset=org/nosuch"], ["task.dataset=org/nosuch: not in the hub cache",
                                                            "hf download --repo-type dataset org/nosuch"]),
    (["eval", "org/missing"], ["credo eval: org/missing is not a Hugging Face model directory"]),
])
def test_a_missing_id_is_one_line_exit_1_no_traceback(hub, args, words):
    out = credo(hub, *args[:1], *(["--run-dir", str(hub["root"] / "never")] if args[0] == "train" else []),
                *args[1:])
    err = out.stderr.strip()
    assert out.returncode == 1, err[-2000:]
    assert len(err.splitlines()) == 1 and err.startswith("credo: error: ")
    assert str(hub["cache"]) in err or args[0] == "eval" or "dataset" in err
    for w in words:
        assert w in err
    assert not (hub["root"] / "never").exists()


def test_the_gsm8k_preset_runs_offline_from_the_cache(tmp_path, hub):
    """configs/gsm8k.yaml as a user runs it, at CPU scale: its model and dataset ids stand in the cache as a tiny
    chat model and a few GSM8K-style rows (the real ones need the hub); the math verifier scores the answers."""
    cache = tmp_path / "hub"
    add_model_dir(cache, "Qwen/Qwen2.5-0.5B-Instruct",
                  save_tiny_model(tmp_path / "chat", max_position_embeddings=512, chat=True))
    rows = [{"question": f"Ann has {i} pens and gets 2 more. How many?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"}
            for i in range(12)]
    add_dataset(cache, "openai/gsm8k", {"train": rows, "test": rows[:4]})
    env = {**hub["env"], "HF_HUB_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", "train", "--config", "gsm8k", "--run-dir",
                          str(tmp_path / "run"), "model.device=cpu", "model.dtype=float32", "reward.workers=1",
                          "rollout.max_new_tokens=8", "rollout.group_size=2", "train.steps=1",
                          "train.prompts_per_step=2", "train.micro_batch_size=null", "eval.size=2", "train.threads=1"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cfg["model"]["path"].startswith("Qwen/Qwen2.5-0.5B-Instruct@")
    assert cfg["task"]["dataset"].startswith("openai/gsm8k@") and cfg["reward"]["name"] == "math"
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [m for m in metrics if "reward/mean" in m]
    assert step["reward/verifier_failures"] == 0  # math-verify parsed every gold answer the transform left
    sample = json.loads((tmp_path / "run" / "eval_samples" / "step_000000.jsonl").read_text().splitlines()[0])
    assert sample["uid"] == "openai/gsm8k[test]:0" and sample["answer"] == "2"
    assert sample["prompt"] == ("<user>Ann has 0 pens and gets 2 more. How many?\nPlease reason step by step, and "
                                "put your final answer within \\boxed{}.\n<assistant>")  # the chat template
