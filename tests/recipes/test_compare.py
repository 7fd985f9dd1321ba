"""credo compare end to end: a killed comparison continues to the uninterrupted one's results; OUT belongs to one
spec (credo.recipes.compare)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from credo.recipes.compare import claim_out_dir
from credo.recipes.compare_spec import SpecError, spec_from_dict
from tests.conftest import TINY_COLD

REPO = Path(__file__).resolve().parents[2]
ARGS = [*TINY_COLD, "eval.every=1", "checkpoint.every=1", "log.tensorboard=false", "train.mini_batch_size=8",
        "reward.name=tests.reward_fixtures:length_score", "train.steps=3"]


def _compare(out: Path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)} | (env_extra or {})
    env.pop("CREDO_KILL_AT", None) if not env_extra else None
    return subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", "compare", "--presets", "grpo,cispo",
                           "--seeds", "2", "--out", str(out), *ARGS], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def _numbers(out: Path) -> dict:
    data = json.loads((out / "compare.json").read_text())
    return {"metrics": data["metrics"], "curves": data["curves"], "seeds": data["seeds"],
            "tokens": {a: [(r["sampled_tokens"], r["trained_tokens"], r["steps"], r["start_weights"])
                           for r in v["runs"]] for a, v in data["arms"].items()}}


@pytest.mark.resume
def test_a_killed_compare_continues_to_the_uninterrupted_results(tmp_path):
    full = _compare(tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    killed = _compare(tmp_path / "cut", {"CREDO_KILL_AT": "update@2"})  # every run dies after step 2's update
    assert killed.returncode == 1 and "4 run(s) failed" in killed.stderr
    cut = json.loads((tmp_path / "cut" / "compare.json").read_text())
    assert cut["seeds"] == [] and len(cut["failed"]) == 4  # no seed finished in every arm: nothing summarised
    assert (tmp_path / "cut" / "grpo" / "seed0" / "checkpoints" / "latest").is_file()
    again = _compare(tmp_path / "cut")  # resumes each run from its checkpoint
    assert again.returncode == 0, again.stderr[-2000:]
    assert _numbers(tmp_path / "cut") == _numbers(tmp_path / "full")
    data = json.loads((tmp_path / "full" / "compare.json").read_text())
    assert data["same_start_weights"] == {"0": True, "1": True}
    assert data["arms"]["grpo"]["runs"][0]["start_weights"] != data["arms"]["grpo"]["runs"][1]["start_weights"]


def test_out_dir_belongs_to_one_spec(tmp_path):
    spec = spec_from_dict({"arms": {"a": "grpo"}, "seeds": 2})
    claim_out_dir(spec, tmp_path / "out")
    claim_out_dir(spec, tmp_path / "out")  # the same spec again: continues
    with pytest.raises(SpecError, match="another compare spec"):
        claim_out_dir(spec_from_dict({"arms": {"a": "grpo"}, "seeds": 3}), tmp_path / "out")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("x")
    with pytest.raises(SpecError, match="not empty"):
        claim_out_dir(spec, tmp_path / "busy")
    assert (tmp_path / "busy" / "mine.txt").read_text() == "x"


def test_links_planted_in_out_are_refused(tmp_path):
    """A run directory in OUT that holds a symlink, or a run's log that is one, is refused, not read or written
    through (credo.tracking.rundir's rule: links inside a run directory)."""
    from credo.recipes.compare import run_one
    from credo.tracking.rundir import UnsafeRunDir

    spec = spec_from_dict({"arms": {"a": "grpo"}, "seeds": 1})
    secret = tmp_path / "secret"
    secret.mkdir()
    (tmp_path / "out2" / "a" / "seed0").mkdir(parents=True)
    (tmp_path / "out2" / "a" / "seed0" / "summary.json").symlink_to(secret / "x.json")
    with pytest.raises(UnsafeRunDir):
        run_one(spec, tmp_path / "out2", "a", 0, threads=None)
    target = tmp_path / "victim.log"
    (tmp_path / "out3" / "a").mkdir(parents=True)
    (tmp_path / "out3" / "a" / "seed0.log").symlink_to(target)
    with pytest.raises(UnsafeRunDir):
        run_one(spec_from_dict({"arms": {"a": "nope-preset"}, "seeds": 1}), tmp_path / "out3", "a", 0, threads=None)
    assert not target.exists()
