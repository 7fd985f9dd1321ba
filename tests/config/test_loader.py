"""Config: defaults, presets, overrides, and one-line errors (exit code 2) before any model is built."""
from __future__ import annotations

from pathlib import Path

import pytest

from credo.cli.main import main
from credo.config import ConfigError, RunConfig, dump_config, load_config, parse_override
from credo.config.loader import REPO_CONFIGS


def test_defaults_are_the_dataclass_defaults():
    cfg = load_config()
    assert cfg == RunConfig()
    assert cfg.task.name == "reversal" and cfg.algo.advantage == "grpo" and cfg.algo.policy_loss == "ppo"


def test_overrides_and_value_parsing():
    cfg = load_config(None, ["train.lr=1e-3", "rollout.group_size=4", "algo.policy_loss_args.clip_high=0.28",
                             "model.path=null", "train.betas=[0.9, 0.95]", "log.tensorboard=false",
                             "task.params.max_len=5"])
    assert cfg.train.lr == 1e-3 and isinstance(cfg.train.lr, float)
    assert cfg.rollout.group_size == 4
    assert cfg.algo.policy_loss_args == {"clip_high": 0.28}
    assert cfg.train.betas == [0.9, 0.95]
    assert cfg.log.tensorboard is False
    assert cfg.task.params == {"max_len": 5}
    assert parse_override("a.b=1e-3") == ("a.b", 1e-3)
    assert parse_override("x=hello") == ("x", "hello")


def test_every_preset_in_configs_loads():
    presets = sorted(REPO_CONFIGS.glob("*.yaml"))
    assert presets, "configs/ should ship presets"
    for p in presets:
        if p.name.startswith("rm_"):  # a `credo rm train` preset: its own config root
            from credo.methods.reward_models.config import RmRunConfig

            load_config(str(p), root=RmRunConfig)
        else:
            load_config(str(p))


def test_yaml_roundtrip(tmp_path: Path):
    cfg = load_config(None, ["train.steps=7", "algo.policy_loss_args.clip_high=0.28"])
    dump_config(cfg, tmp_path / "c.yaml")
    assert load_config(str(tmp_path / "c.yaml")) == cfg


@pytest.mark.parametrize("override, message", [
    (["train.lrr=1"], "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
    (["lr=1e-3"], "unknown key 'lr' (did you mean 'train.lr' or 'critic.lr' or 'warm_start.lr'?)"),
    (["train.steps=ten"], "train.steps: expected int, got 'ten'"),
    (["train.steps=1.5"], "train.steps: expected int, got 1.5"),
    (["train.lr=-1"], "train.lr: must be >= 0.0"),
    (["algo.agg=token_mean"], "algo.agg: 'token_mean' is not one of"),
    (["algo.policy_loss=ppoo"], "algo.policy_loss: unknown policy loss 'ppoo' (did you mean 'ppo'?)"),
    (["algo.policy_loss_args.clip_hgh=0.3"], "algo.policy_loss_args: policy loss 'ppo' has no hyperparameter "
                                             "'clip_hgh' (did you mean 'clip_high'?)"),
    (["algo.advantage=grpoo"], "did you mean 'grpo'"),
    (["algo.kl_estimator=k9"], "algo.kl_estimator: unknown KL estimator"),
    (["task.name=reversl"], "task.name: unknown task 'reversl' (did you mean 'reversal'?)"),
    (["task.params.max_lne=3"], "task.params.max_lne: task 'reversal' has no parameter 'max_lne' (did you mean "
                                "'max_len'?)"),
    (["reward.name=exact_mach"], "reward.name:"),
    (["train.mini_batch_size=7"], "train.mini_batch_size: 7 must divide"),
    (["task.name=file"], "task.train_file: required when task.name=file"),
    (["model=3"], "model: expected a section"),
    (["train.steps"], "must look like key=value"),
    # agent section
    (["rollout.collector.type=agent", "rollout.collector.envs=[clac]"], "rollout.collector.envs[0]: unknown environment 'clac' (did you mean 'calc'?)"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.env_params={calc: {digit: 1}}"], "rollout.collector.env_params.calc: environment 'calc' has "
                                                                   "no parameter(s) ['digit']"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc, maze]", "rollout.collector.env_weights=[1]"], "rollout.collector.env_weights: expected 2 non-negative numbers"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.server_urls={maze: 'http://127.0.0.1:1'}"], "rollout.collector.server_urls.maze: 'maze' is "
                                                                              "neither trained nor evaluated"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.server_urls={calc: 'localhost:80'}"], "rollout.collector.server_urls.calc: expected an http"),
    (["rollout.collector.type=agent", "rollout.collector.stages=[{envs: [maze], steps: 0}]"], "rollout.collector.stages[0]: expected {envs: [name, ...], steps: N>=1}"),
    (["rollout.collector.type=agent", "rollout.collector.stages=[{envs: [maez], steps: 5}]"], "rollout.collector.stages[0].envs[0]: unknown environment 'maez'"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.stages=[{envs: [maze], steps: 5}]"], "rollout.collector.stages: set either rollout.collector.envs"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.horizon_schedule=stepwise"], "rollout.collector.horizon_rounds: stepwise needs a non-empty"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.horizon_rounds=[2, 4]"], "rollout.collector.horizon_rounds: only used with"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.branching=arpo", "rollout.collector.branch_args={beam: 2}"],
     "rollout.collector.branch_args.beam: arpo has no parameter 'beam' (did you mean 'beam_size'?)"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "rollout.collector.branch_args={beam_size: 2}"], "rollout.collector.branch_args: only used with"),
    (["rollout.collector.type=agent", "rollout.collector.envs=[calc]", "model.max_position_embeddings=128"], "model.max_position_embeddings: 128 positions "
                                                                 "cannot hold"),
])
def test_bad_config_is_a_one_line_error_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, override)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_yaml_file_and_missing_preset(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="not found"):
        load_config("no_such_preset")


def test_cli_exits_2_with_one_line_before_building_a_model(monkeypatch, capsys, tmp_path):
    import credo.models.build as build

    def no_build(*a, **k):
        raise AssertionError("a model was built despite a bad config")

    monkeypatch.setattr(build, "build_model", no_build)
    monkeypatch.setattr(build, "load_model", no_build)
    code = main(["train", f"output_dir={tmp_path}", "train.lerning_rate=1"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0
    assert err.startswith("credo: config error: unknown key 'train.lerning_rate'")
    assert not any(tmp_path.iterdir()), "nothing may be written for a bad config"


def test_readme_config_reference_is_in_sync():
    from credo.config.reference import embed

    readme = (REPO_CONFIGS.parent / "README.md").read_text()
    assert embed(readme) == readme, "run: python -m credo.config.reference --readme README.md"
