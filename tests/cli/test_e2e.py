"""End-to-end runs through the real CLI: files, learning signal, determinism, resume, bad inputs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from credo.cli.main import main
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY_COLD, TINY_PRETRAINED, TINY_RUN

REPO = Path(__file__).resolve().parents[2]
VOLATILE = ("timing_s/", "perf/tokens_per_s", "perf/gen_tokens_per_s")


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "credo.cli.main", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_train_writes_everything_and_changes_parameters(tmp_path: Path):
    run = tmp_path / "run"
    proc = _cli("train", "--run-dir", str(run), *TINY_COLD, "train.steps=3", "warm_start.enabled=false",
                "eval.every=2", "checkpoint.every=2", "reward.name=tests.reward_fixtures:length_score")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.html", "final/model.safetensors",
                 "final/config.json", "final/tokenizer.json", "plots/reward_accuracy.png", "plots/time_split.png",
                 "eval_samples/step_000000.jsonl", "checkpoints/latest"):
        assert (run / name).is_file(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    step = rows[1]
    for key in ("reward/mean", "reward/std", "acc/mean", "response_length/mean", "actor/entropy", "actor/pg_clipfrac",
                "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/grad_norm", "actor/lr", "timing_s/gen",
                "timing_s/reward", "timing_s/update", "perf/tokens_per_s", "reward/verifier_failures"):
        assert key in step, key
    assert "eval/greedy_acc" in rows[0] and "eval/avg@2" in rows[2] and "eval/pass@2" in rows[3]
    # RL alone (no warm start) moved the weights away from the seeded initialisation
    from credo.config import load_config
    from credo.models import build_model

    init, _ = build_model(load_config(str(run / "config.yaml")).model, seed=0)
    final = load_file(run / "final" / "model.safetensors")
    changed = [k for k, v in init.state_dict().items() if k in final and not torch.equal(v, final[k])]
    assert len(changed) > len(final) // 2
    assert "report:" in proc.stdout and "greedy_acc" in proc.stdout


def test_same_seed_same_metrics(tmp_path: Path):
    args = [*TINY_RUN, "train.steps=3", "eval.every=0", "log.report=false", "log.tensorboard=false"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "a"), *args]) == 0
    assert main(["-q", "train", "--run-dir", str(tmp_path / "b"), *args]) == 0
    a = _stable(read_metrics(tmp_path / "a" / "metrics.jsonl"))
    b = _stable(read_metrics(tmp_path / "b" / "metrics.jsonl"))
    assert a == b and len(a) == 4
    assert main(["-q", "train", "--run-dir", str(tmp_path / "c"), *args, "seed=1"]) == 0
    assert _stable(read_metrics(tmp_path / "c" / "metrics.jsonl")) != a


def test_killed_run_resumes_to_the_same_metrics(tmp_path: Path):
    args = [*TINY_RUN, "train.steps=6", "checkpoint.every=2", "eval.every=3", "log.report=false",
            "reward.name=tests.reward_fixtures:slow_length_score", "train.mini_batch_size=8",
            "train.micro_batch_size=4", "train.lr_schedule=cosine"]
    full = _cli("train", "--run-dir", str(tmp_path / "full"), *args)
    assert full.returncode == 0, full.stderr[-2000:]

    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "credo.cli.main", "train", "--run-dir", str(run), *args], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = run / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and not (latest.is_file() and latest.read_text().strip() == "step_000002"):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"
    assert len(read_metrics(run / "metrics.jsonl")) >= 3

    resumed = _cli("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = _stable(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    b = _stable(read_metrics(run / "metrics.jsonl"))
    assert [r["step"] for r in b] == list(range(7))
    assert a == b
    sa = json.loads((tmp_path / "full" / "summary.json").read_text())
    sb = json.loads((run / "summary.json").read_text())
    assert {k: v for k, v in sa.items() if k != "train_wall_s"} == {k: v for k, v in sb.items() if k != "train_wall_s"}


def test_resume_errors(tmp_path: Path, capsys):
    assert main(["train", "--resume", str(tmp_path)]) == 1
    assert "not a credo run directory" in capsys.readouterr().err
    args = [*TINY_RUN, "train.steps=1", "log.report=false", "log.tensorboard=false", "checkpoint.every=0"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "r"), *args]) == 0
    assert main(["-q", "train", "--run-dir", str(tmp_path / "r"), *args]) == 1  # refuses to overwrite a run
    assert "--resume" in capsys.readouterr().err


def test_failing_verifier_never_stops_the_run(tmp_path: Path):
    args = [*TINY_COLD, "train.steps=2", "eval.every=0", "log.report=false", "log.tensorboard=false",
            "reward.name=tests.reward_fixtures:flaky", "reward.timeout_s=0.5", "reward.failure_score=-1",
            "warm_start.enabled=false", "rollout.max_new_tokens=4"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "r"), *args]) == 0
    rows = read_metrics(tmp_path / "r" / "metrics.jsonl")
    failures = sum(r.get("reward/verifier_failures", 0) for r in rows)
    assert failures > 0
    assert min(r["reward/min"] for r in rows if "reward/min" in r) == -1.0


def test_user_jsonl_dataset_with_bad_rows(tmp_path: Path, capsys, caplog):
    data = tmp_path / "data.jsonl"
    good = [json.dumps({"prompt": f"rev {s}=", "answer": s[::-1]}) for s in ("abc", "bca", "cab", "dab", "bad", "cad",
                                                                              "fed", "ged", "hag", "gah")]
    data.write_text("\n".join(good[:5] + ["{not json", json.dumps({"prompt": "x"})] + good[5:]) + "\n")
    args = [*TINY_RUN, "task.name=file", f"task.train_file={data}", "task.eval_fraction=0.2", "train.steps=1",
            "log.report=false", "log.tensorboard=false"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "skip"), *args]) == 0
    warned = caplog.text
    assert "skipped 2 of 12 rows" in warned and f"{data}:6: invalid JSON" in warned
    assert f"{data}:7: missing field 'answer'" in warned
    assert json.loads((tmp_path / "skip" / "summary.json").read_text())["data/bad_rows"] == 2
    capsys.readouterr()
    assert main(["-q", "train", "--run-dir", str(tmp_path / "strict"), *args, "task.on_bad_row=error"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("credo: error:") and f"{data}:6" in err


def test_sft_eval_report_and_list_commands(tmp_path: Path, capsys):
    run = tmp_path / "sft"
    assert main(["-q", "sft", "--run-dir", str(run), *TINY_RUN, "warm_start.steps=4", "log.tensorboard=false"]) == 0
    assert (run / "final" / "model.safetensors").is_file() and (run / "warm_start.jsonl").is_file()
    assert len(read_metrics(run / "warm_start.jsonl")) == 4
    capsys.readouterr()
    assert main(["-q", "eval", str(run)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["examples"] == 8 and 0.0 <= metrics["eval/greedy_acc"] <= 1.0
    # the model directory itself, with a config given on the command line
    assert main(["-q", "eval", str(run / "final"), *TINY_RUN]) == 0
    assert json.loads(capsys.readouterr().out)["eval/greedy_acc"] == metrics["eval/greedy_acc"]
    # continue with RL from the SFT model
    rl = tmp_path / "rl"
    assert main(["-q", "train", "--run-dir", str(rl), *TINY_PRETRAINED, f"model.path={run / 'final'}", "train.steps=1",
                 "log.tensorboard=false"]) == 0
    assert not (rl / "warm_start.jsonl").exists(), "a loaded model gets no warm start by default"
    assert main(["report", str(rl)]) == 0
    assert capsys.readouterr().out.strip().endswith("report.html")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("ppo", "grpo", "exact_match", "countdown", "math", "reversal", "addition", "token-mean", "k3"):
        assert name in out


def test_kl_against_frozen_reference_in_loss_and_in_reward(tmp_path: Path):
    base = [*TINY_RUN, "eval.every=0", "log.report=false", "log.tensorboard=false", "algo.kl_coef=0.05",
            "reward.name=tests.reward_fixtures:length_score", "train.ppo_epochs=2", "train.mini_batch_size=8"]
    run = tmp_path / "loss"
    assert main(["-q", "train", "--run-dir", str(run), *base, "train.steps=2", "algo.kl_estimator=k3+"]) == 0
    assert (run / "reference" / "model.safetensors").is_file()
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "actor/kl" in r]
    assert len(rows) == 2 and all("actor/kl_loss" in r for r in rows)
    assert rows[-1]["actor/kl"] > 0  # the policy moved away from the reference
    # extend the finished run by one step: the reference is reloaded from the run directory
    assert main(["-q", "train", "--resume", str(run), "train.steps=3"]) == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")][-1] == 3
    run = tmp_path / "reward"
    assert main(["-q", "train", "--run-dir", str(run), *base, "train.steps=2", "algo.kl_in_reward=true",
                 "algo.advantage=reinforce_pp",
                 "algo.kl_estimator=k1"]) == 0
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "actor/kl" in r]
    assert all("actor/reward_kl_penalty" in r and "actor/kl_loss" not in r for r in rows)


ALGORITHM_PRESETS = {
    # preset: metric keys that show its distinctive pieces ran
    "grpo": ["actor/pg_clipfrac"],
    "dr_grpo": ["actor/pg_loss"],
    "dapo": ["filter/kept_groups", "filter/gen_batches", "reward/overlong_penalty_mean"],
    "ppo": ["critic/vf_loss", "critic/vf_explained_var", "critic/vf_clipfrac"],
    "gppo": ["actor/sft_loss", "filter/kept_groups"],
    "cegppo": ["actor/sft_loss"],
    "aspo": ["actor/high_entropy_frac", "actor/aspo_pos_dual_frac", "actor/aspo_kl_loss"],
    "archer": ["actor/high_entropy_frac", "actor/kl_loss_low_entropy"],
    "papo": ["papo/phase", "papo/frac_expand"],
    "evpo": ["evpo/explained_variance", "evpo/use_critic", "critic/vf_loss"],
    "gspo": ["actor/pg_clipfrac"],
    "cispo": ["actor/pg_clipfrac"],
    "dppo": ["actor/pg_clipfrac", "actor/pg_clipfrac_lower"],
    "otb": ["otb/token_energy_mean", "timing_s/old_logprob"],
    "gdpo": ["gdpo/score/frac_zero_std"],
}


def test_every_algorithm_preset_runs_through_the_cli(tmp_path: Path):
    for preset, keys in ALGORITHM_PRESETS.items():
        run = tmp_path / preset
        code = main(["-q", "train", "--config", preset, "--run-dir", str(run), *TINY_COLD, "train.steps=2",
                     "train.prompts_per_step=4", "rollout.group_size=4", "train.mini_batch_size=8",
                     "eval.every=0", "log.report=false", "log.tensorboard=false", "warm_start.enabled=false",
                     "reward.name=tests.reward_fixtures:length_score"])
        assert code == 0, preset
        rows = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
        assert len(rows) == 2, preset
        seen = set().union(*rows)
        missing = [k for k in keys if k not in seen]
        assert not missing, f"{preset}: {missing}"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 2


def test_compare_writes_table_plot_and_reuses_finished_runs(tmp_path: Path, capsys):
    out = tmp_path / "cmp"
    mine = tmp_path / "my_cispo.yaml"  # a preset given as a YAML file: its stem names its arm and runs
    mine.write_text((REPO / "configs" / "cispo.yaml").read_text())
    args = ["-q", "compare", "--presets", f"grpo,{mine}", "--seeds", "2", "--target", "0.0", "--out", str(out),
            "--jobs", "2", *TINY_COLD, "train.steps=2", "eval.every=1", "log.tensorboard=false", "log.rollouts_every=1",
            "train.mini_batch_size=8", "reward.name=tests.reward_fixtures:length_score"]
    assert main(args) == 0
    for seed in (0, 1):  # the same seed: the same prompts in the same order in both arms, another seed: others
        uids = [[json.loads(line)["uid"] for line in (out / arm / f"seed{seed}" / "rollouts.jsonl").open()]
                for arm in ("grpo", "my_cispo")]
        assert uids[0] == uids[1]
    assert uids[0] != [json.loads(line)["uid"] for line in (out / "grpo" / "seed0" / "rollouts.jsonl").open()]
    table = (out / "compare.md").read_text()
    assert "| grpo |" in table and "| my_cispo |" in table and "## eval/greedy_acc@steps_to:0.0" in table
    data = json.loads((out / "compare.json").read_text())
    assert list(data["arms"]) == ["grpo", "my_cispo"] and data["seeds"] == [0, 1] and data["baseline"] == "grpo"
    assert (out / "my_cispo" / "seed1" / "summary.json").is_file()
    steps_to = data["metrics"]["eval/greedy_acc@steps_to:0.0"]
    assert steps_to["arms"]["grpo"]["values"] == [0.0, 0.0]  # target 0 is met at step 0
    assert steps_to["vs_baseline"]["my_cispo"]["verdict"] == "too few seeds"  # 2 < 5 seeds: no verdict
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    stamp = (out / "grpo" / "seed0" / "summary.json").stat().st_mtime_ns
    assert main(args) == 0  # finished runs are reused, not retrained
    assert (out / "grpo" / "seed0" / "summary.json").stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert main(["compare", "--presets", "grpo,nope", "--out", str(tmp_path / "x")]) == 2
    assert "config error" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_critic_run_extended_by_resume_equals_one_long_run(tmp_path: Path):
    """The critic, its optimizer and scheduler are checkpointed: 2 steps + resume to 4 == 4 steps."""
    args = ["-q", "train", "--config", "ppo", *TINY_COLD, "eval.every=2", "checkpoint.every=2", "log.report=false",
            "log.tensorboard=false", "warm_start.enabled=false", "reward.name=tests.reward_fixtures:length_score"]
    assert main([*args, "--run-dir", str(tmp_path / "full"), "train.steps=4"]) == 0
    assert main([*args, "--run-dir", str(tmp_path / "part"), "train.steps=2"]) == 0
    assert (tmp_path / "part" / "checkpoints" / "step_000002" / "critic" / "value_head.safetensors").is_file()
    assert main(["-q", "train", "--resume", str(tmp_path / "part"), "train.steps=4"]) == 0
    full = _stable(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    part = _stable(read_metrics(tmp_path / "part" / "metrics.jsonl"))
    assert "critic/vf_loss" in full[-1] and full == part


def test_remax_runs_greedy_baselines(tmp_path: Path):
    run = tmp_path / "remax"
    assert main(["-q", "train", "--run-dir", str(run), *TINY_RUN, "train.steps=1", "algo.advantage=remax",
                 "eval.every=0", "log.report=false", "log.tensorboard=false"]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert "timing_s/gen_baseline" in rows[-1]
