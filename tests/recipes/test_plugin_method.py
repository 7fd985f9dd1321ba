"""The worked plugin of docs/extending.md (a batch transform and a loss term, no credo file edited), extracted from
the page and run through the real CLI: ``credo train --plugin surprise_method ext.surprise.coef=...``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- plugin: {} -->"
TINY = ["train.steps=2", "warm_start.steps=1", "eval.size=4", "eval.k=1", "log.progress=false",
        "log.tensorboard=false", "log.report=false", "checkpoint.every=0", "checkpoint.save_final=false",
        "train.threads=1"]


def plugin_source(name: str = "surprise_method.py") -> str:
    """The first python block after the marker ``name`` in docs/extending.md."""
    page = (REPO / "docs" / "extending.md").read_text()
    after = page[page.index(MARKER.format(name)):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plugin")
    for name in ("surprise_method.py", "my_collector.py"):
        (d / name).write_text(plugin_source(name))
    return d


def credo(plugin_dir: Path, run_dir: Path, *args: str, plugin: str = "surprise_method") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(plugin_dir), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", "train", "--plugin", plugin, *args, "--run-dir", str(run_dir), "--overwrite"], cwd=plugin_dir, env=env,
                          capture_output=True, text=True, timeout=900)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_documented_plugin_runs_its_transform_and_loss_term(plugin_dir, tmp_path):
    out = credo(plugin_dir, tmp_path / "on", "ext.surprise.coef=0.5", "ext.surprise.cap=3", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [r for r in rows(tmp_path / "on") if "surprise/weight_mean" in r]
    assert len(steps) == 2  # both RL steps ran the transform ...
    assert all("surprise/proximal_loss" in r for r in steps)  # ... and the loss term
    assert all(0.0 < r["surprise/weight_mean"] <= 3.0 for r in steps)  # w_t in (0, cap]
    # the transform reads old_logprobs, so the plan kept the old-log-prob pass (the fused update reports no
    # timing_s/old_logprob) although this is one optimizer step on the whole batch
    assert all("timing_s/old_logprob" in r for r in steps)


def test_without_its_section_the_plugin_is_off(plugin_dir, tmp_path):
    out = credo(plugin_dir, tmp_path / "off", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = rows(tmp_path / "off")[1:]
    assert steps and not any(k.startswith("surprise/") for r in steps for k in r)
    assert not any("timing_s/old_logprob" in r for r in steps)  # plain GRPO: the pass fused into the update


def test_its_settings_are_checked_when_the_config_loads(plugin_dir, tmp_path):
    out = credo(plugin_dir, tmp_path / "typo", "ext.surprise.cofe=0.5", *TINY)
    assert out.returncode != 0 and "did you mean 'ext.surprise.coef'" in out.stderr
    out = credo(plugin_dir, tmp_path / "bound", "ext.surprise.coef=-1", *TINY)
    assert out.returncode != 0 and "ext.surprise.coef" in out.stderr
    out = credo(plugin_dir, tmp_path / "unknown", "ext.surprize.coef=1", *TINY)
    assert out.returncode != 0 and "did you mean 'surprise'" in out.stderr
    assert not (tmp_path / "typo" / "metrics.jsonl").exists()  # nothing trained


def test_the_documented_collector_registers_with_one_call(plugin_dir, tmp_path):
    out = credo(plugin_dir, tmp_path / "grow", "rollout.collector.type=growing", "rollout.collector.grow_every=1",
                *TINY, plugin="my_collector")
    assert out.returncode == 0, out.stderr[-3000:]
    budgets = [r["growing/max_new_tokens"] for r in rows(tmp_path / "grow") if "growing/max_new_tokens" in r]
    assert budgets == [4, 5]  # start_tokens 4, one more token per step
