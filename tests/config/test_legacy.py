"""The config layout before the choice sections still loads (credo.config.legacy), and the new layout cannot
express the combinations the old one had to refuse at load time.

The fixtures are RUN_DIR/config.yaml files written by credo at commit fa29453 (tests/fixtures/legacy/README.md).
"""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from credo.config import ConfigError, config_to_dict, load_config

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"
# the overrides the fixtures were written with (tools/same_metrics.py SHORT)
SHORT = ["train.steps=3", "eval.every=2", "eval.size=16", "eval.k=2", "warm_start.steps=80", "log.progress=false",
         "log.tensorboard=false", "log.report=false", "checkpoint.every=0", "checkpoint.save_final=false",
         "train.threads=1"]
PRESETS = {"demo": (None, []), "attnrl": ("attnrl", []), "vepo": ("vepo", []), "agent_calc": ("agent_calc", []),
           "rlep": ("rlep", ["replay.collect_prompts=32", "replay.collect_samples=8"])}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_an_old_run_config_loads_as_the_new_preset(name):
    """An older credo's full dump of a run's config is the same run as the current preset with the same
    overrides (every key, not only the moved ones)."""
    from credo.train.update import rollout_correction_mode

    preset, extra = PRESETS[name]
    old, new = load_config(str(LEGACY / f"{name}.yaml")), load_config(preset, [*extra, *SHORT])
    assert (old.algo.rollout_correction, new.algo.rollout_correction) == ("none", "auto")  # the default changed
    for cfg in (old, new):  # ... to one that resolves to the old one with the hf engine
        cfg.algo.rollout_correction = rollout_correction_mode(cfg)
    assert config_to_dict(old) == config_to_dict(new)


def test_old_sections_map_to_the_choices_with_one_notice_each(caplog, monkeypatch):
    from credo.config import legacy

    monkeypatch.setattr(legacy, "_told", set())  # one notice per section per process
    with caplog.at_level(logging.WARNING, logger="credo.config"):
        cfg = load_config(str(LEGACY / "attnrl.yaml"))
    c = cfg.rollout.collector
    assert (c.type, c.num_splits, c.ignore, c.min_gap, c.max_prompts) == ("tree", 2, 1, 1, 32)  # configs/attnrl.yaml
    assert cfg.token_select.type == "none" and cfg.replay is None
    notices = [r.getMessage() for r in caplog.records]
    assert sum("attnrl.* is deprecated, now rollout.collector (type: tree)" in m for m in notices) == 1
    agent = load_config(str(LEGACY / "agent_calc.yaml")).rollout.collector
    assert (agent.type, agent.envs, agent.max_turns, agent.env_params) == ("agent", ["calc"], 3,
                                                                           {"calc": {"digits": 1, "terms": 2}})
    assert load_config(str(LEGACY / "vepo.yaml")).token_select.type == "vepo"
    assert load_config(str(LEGACY / "rlep.yaml")).replay.pool == "warm_start"


@pytest.mark.parametrize("overrides, expect", [
    (["attnrl.enabled=true", "attnrl.num_splits=3", "algo.advantage=attnrl"], ("tree", "num_splits", 3)),
    (["agent.envs=[calc]", "agent.max_turns=2"], ("agent", "max_turns", 2)),
    (["algo.filter_groups=true", "algo.max_gen_batches=5"], ("group", "max_gen_batches", 5)),
])
def test_old_override_keys_map_to_the_collector(overrides, expect):
    c = load_config(None, overrides).rollout.collector
    assert (c.type, getattr(c, expect[1])) == (expect[0], expect[2])


def test_old_override_keys_read_against_the_preset():
    """``attnrl.num_splits=3`` on a tree preset sets its key; ``attnrl.enabled=false`` switches back to groups;
    ``agent.max_turns`` on an agent preset sets the collector's; the entropy share maps to token_select."""
    assert load_config("attnrl", ["attnrl.num_splits=3"]).rollout.collector.num_splits == 3
    back = load_config("attnrl", ["attnrl.enabled=false", "algo.advantage=grpo"]).rollout.collector
    assert back.type == "group" and not hasattr(back, "num_splits")
    assert load_config("agent_calc", ["agent.max_turns=5"]).rollout.collector.max_turns == 5
    sel = load_config(None, ["algo.top_entropy_quantile=0.2"]).token_select
    assert (sel.type, sel.top_fraction) == ("entropy", 0.2)
    assert load_config(None, ["algo.top_entropy_quantile=1.0"]).token_select.type == "none"


@pytest.mark.parametrize("overrides, message", [
    (["rm.method=bt"], "unknown key 'rm': reward-model settings belong to `credo rm train`"),
    (["birm.steps=3"], "unknown key 'birm'"),
    # impossible combinations of the old layout cannot be written any more
    (["rollout.collector.type=tree", "rollout.collector.filter_groups=true"],
     "unknown key 'rollout.collector.filter_groups' for rollout.collector.type=tree (a key of type group)"),
    (["rollout.collector.type=agent", "rollout.collector.num_splits=2"], "(a key of type tree)"),
    (["token_select.type=entropy", "token_select.perturb=mask"], "(a key of type vepo)"),
    (["rollout.collector.type=trees"], "rollout.collector.type: 'trees' is not one of group, tree, agent, gateway "
                                       "(did you mean 'tree'?)"),
    # ... and old-layout ones that have no single meaning are one line
    (["attnrl.enabled=true", "agent.envs=[calc]", "algo.advantage=attnrl"], "choose one"),
    (["vepo.enabled=true", "algo.top_entropy_quantile=0.2"], "choose one"),
    (["agent.max_turns=5"], "agent keys are now rollout.collector.* with rollout.collector.type=agent"),
    (["-c", "attnrl", "algo.filter_groups=true"], "group filtering is for the group collector"),
])
def test_config_errors(overrides, message):
    preset = overrides[1] if overrides[0] == "-c" else None
    with pytest.raises(ConfigError) as info:
        load_config(preset, overrides[2:] if preset else overrides)
    assert message in str(info.value)


def test_a_replay_section_without_a_pool_is_refused_for_training(tmp_path, capsys):
    """``credo rlep collect`` reads a pool-less replay section's collect_* keys; ``credo train`` refuses it before
    anything is built."""
    from credo.cli.main import main

    assert load_config(None, ["replay.collect_samples=3"]).replay.collect_samples == 3
    assert main(["train", "--run-dir", str(tmp_path / "r"), "replay.num=3"]) == 2
    assert "replay.pool: required to train with a replay section" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_new_type_on_the_command_line_starts_its_section_afresh():
    cfg = load_config("dapo", ["rollout.collector.type=tree", "algo.advantage=attnrl"])
    assert cfg.rollout.collector.type == "tree" and cfg.rollout.collector.num_splits == 2  # dapo's keys are gone


def test_credo_train_refuses_rm_keys_and_rm_train_accepts_them(capsys):
    from credo.cli.main import main
    from credo.methods.reward_models.config import RmRunConfig

    assert main(["train", "rm.method=bt"]) == 2
    assert "unknown key 'rm'" in capsys.readouterr().err
    cfg = load_config(None, ["rm.method=crm", "birm.steps=3"], root=RmRunConfig)
    assert (cfg.rm.method, cfg.birm.steps) == ("crm", 3)
    with pytest.raises(ConfigError, match="unknown key 'algo'"):
        load_config(None, ["algo.kl_coef=0.1"], root=RmRunConfig)


def test_an_old_dump_with_non_default_rm_settings_is_refused(tmp_path):
    text = (LEGACY / "demo.yaml").read_text().replace("rm: {method: bt,", "rm: {method: crm,")
    assert "method: crm" in text
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match="belong to `credo rm train`"):
        load_config(str(tmp_path / "c.yaml"))


def _old_layout(new: dict) -> dict:
    """A run's config dump (new layout) as credo wrote it before the choice sections (fa29453): the collector's
    group keys in ``algo``, the entropy share as ``algo.top_entropy_quantile``, ``critic.warmup_steps``, switched-off ``attnrl`` / ``agent`` /
    ``vepo`` sections, ``replay.pool: null`` and default ``rm`` / ``birm`` sections; no ``format_version`` (version
    0)."""
    from dataclasses import asdict

    from credo.methods.birm.config import BiRMConfig
    from credo.methods.reward_models.config import RewardModelConfig

    old = {k: v for k, v in new.items() if k not in ("token_select", "replay", "format_version")}
    collector = old["rollout"].pop("collector")
    assert collector.pop("type") == "group"
    selector = new["token_select"]
    old["algo"] = old["algo"] | collector | {"top_entropy_quantile": selector.get("top_fraction", 1.0)}
    old["critic"] = {("warmup_steps" if k == "pretrain_steps" else k): v for k, v in old["critic"].items()}
    old |= {"agent": {"envs": [], "max_turns": 4}, "attnrl": {"enabled": False, "num_splits": 2},
            "vepo": {"enabled": False, "top_fraction": 0.2}, "replay": {"pool": None, "num": 2},
            "rm": asdict(RewardModelConfig()), "birm": asdict(BiRMConfig())}
    return old


def test_resume_of_a_run_whose_config_is_in_the_old_layout(tmp_path, monkeypatch):
    """A run interrupted after its step-1 checkpoint, whose config.yaml is then rewritten in the old layout (as an
    older credo wrote it), resumes to the same metrics as the uninterrupted run."""
    import json

    import yaml

    import credo.recipes.rlvr as rlvr
    from credo.cli.main import main
    from tests.conftest import TINY_RUN

    args = [*TINY_RUN, "train.steps=3", "checkpoint.every=1", "eval.every=0", "log.progress=false",
            "log.tensorboard=false", "log.report=false", "rollout.collector.filter_groups=true",
            "token_select.type=entropy", "token_select.quantile=0.5"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "full"), *args]) == 0
    real = rlvr.rl_step

    def interrupted(cfg, parts, state, *, step):
        if step == 2:
            raise KeyboardInterrupt
        return real(cfg, parts, state, step=step)

    monkeypatch.setattr(rlvr, "rl_step", interrupted)
    cut = tmp_path / "cut"
    assert main(["-q", "train", "--run-dir", str(cut), *args]) != 0
    monkeypatch.setattr(rlvr, "rl_step", real)
    old = _old_layout(yaml.safe_load((cut / "config.yaml").read_text()))
    (cut / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    assert load_config(str(cut / "config.yaml")) == load_config(str(tmp_path / "full" / "config.yaml"))
    assert main(["-q", "train", "--resume", str(cut)]) == 0

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing_s/", "perf/"))}
                for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert len(rows(cut)) == 4 and rows(cut) == rows(tmp_path / "full")


def test_a_run_config_records_its_format_version_and_upgrade_is_keyed_by_it(tmp_path):
    """dump_config writes the layout's version first and loads back the same config; a file without a version is
    of the oldest layout (version 0: its old keys are upgraded), while at version 1 an old key is an unknown key."""
    from credo.config import dump_config
    from credo.config.legacy import FORMAT_VERSION

    cfg = load_config("attnrl")
    dump_config(cfg, tmp_path / "config.yaml")
    assert (tmp_path / "config.yaml").read_text().startswith(f"format_version: {FORMAT_VERSION}\n")
    assert load_config(str(tmp_path / "config.yaml")) == cfg
    old = "attnrl: {enabled: true, num_splits: 3}\nalgo: {advantage: attnrl}\n"
    (tmp_path / "v0.yaml").write_text(old)
    assert load_config(str(tmp_path / "v0.yaml")).rollout.collector.num_splits == 3
    (tmp_path / "v1.yaml").write_text(f"format_version: {FORMAT_VERSION}\n{old}")
    with pytest.raises(ConfigError, match="unknown key 'attnrl'"):
        load_config(str(tmp_path / "v1.yaml"))


def test_version_1_configs_and_old_overrides_get_the_renamed_keys(tmp_path, caplog):
    """Version 1 -> 2 renamed critic.warmup_steps (RL steps training the critic alone, not an lr warm-up) and the
    entropy selection's token_select.quantile (the share kept, VEPO's top_fraction)."""
    (tmp_path / "v1.yaml").write_text("format_version: 1\ncritic: {warmup_steps: 3}\n"
                                      "token_select: {type: entropy, quantile: 0.3}\n")
    cfg = load_config(str(tmp_path / "v1.yaml"))
    assert cfg.critic.pretrain_steps == 3 and cfg.token_select.top_fraction == 0.3
    cfg = load_config(None, ["critic.warmup_steps=2", "token_select.type=entropy", "token_select.quantile=0.4"])
    assert cfg.critic.pretrain_steps == 2 and cfg.token_select.top_fraction == 0.4
    (tmp_path / "v2.yaml").write_text("format_version: 2\ncritic: {warmup_steps: 3}\n")
    with pytest.raises(ConfigError, match="unknown key 'critic.warmup_steps'"):
        load_config(str(tmp_path / "v2.yaml"))


@pytest.mark.parametrize("version, message", [
    (3, "format_version: the config has version 3, newer than this credo's 2: load it with the credo that wrote it "
        "(or a newer one)"),
    ("'1'", "format_version: '1' is not a config version (an int, 2 for this credo)"),
])
def test_a_config_of_a_newer_or_malformed_version_is_refused_in_one_line(tmp_path, capsys, version, message):
    from credo.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"format_version: {version}\nseed: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(run / "config.yaml"))
    assert str(info.value) == message
    capsys.readouterr()
    assert main(["train", "--config", str(run / "config.yaml")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"credo: config error: {message}"
