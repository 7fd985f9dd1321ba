"""No silent no-ops (credo.config.reads): a key ``credo train`` will not read in the chosen configuration is
refused (or, declared harmless, warned about), decided by each field's ``read_if`` declaration; ``credo config
show`` prints every key's source and marks the ones the run will not read."""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.config import ConfigError, dump_config, load_config, load_config_sources, load_run_config
from credo.config.fields import resolve_class
from credo.config.loader import REPO_CONFIGS
from credo.config.reads import READERS, check_reads, leaf_keys, unread_keys
from credo.config.schema import RunConfig


def _classes(cls: type, seen: set) -> None:
    """Every config dataclass reachable from ``cls``: nested sections, every choice's options, optional
    sections."""
    if cls in seen:
        return
    seen.add(cls)
    import typing

    from credo.config.loader import section_class

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        for path in (f.metadata.get("choice") or {}).values():
            _classes(resolve_class(path), seen)
        if "section" in f.metadata:
            _classes(resolve_class(f.metadata["section"]), seen)
        sub = section_class(hints[f.name])
        if sub is not None:
            _classes(sub, seen)


def test_every_declared_reader_is_registered():
    seen: set = set()
    _classes(RunConfig, seen)
    declared = set()
    for cls in seen:
        for f in dataclasses.fields(cls):
            r = f.metadata.get("read_if")
            declared |= {r} if isinstance(r, str) else set(r or ())
    assert len(seen) > 20 and len(declared) > 30  # the walk reached the method packages' sections
    assert declared <= set(READERS.names()), declared - set(READERS.names())


@pytest.mark.parametrize("overrides, key, needs", [
    # a rollout.vllm.* key with the HF engine
    (["rollout.vllm.prefix_caching=false"], "rollout.vllm.prefix_caching", "rollout.engine=vllm"),
    # a server-mode key of an in-process vLLM engine
    (["rollout.engine=vllm", "rollout.vllm.url=http://127.0.0.1:9"], "rollout.vllm.url", "mode=server"),
    # a critic key without a critic (GRPO reads no values)
    (["critic.lr=0.01"], "critic.lr", "a critic"),
    # async keys in a synchronous run
    (["rollout.partial_kv=recompute"], "rollout.partial_kv", "max_staleness >= 1"),
    (["rollout.off_policy_ratio=recompute"], "rollout.off_policy_ratio", "max_staleness >= 1"),
    # a KL estimator without a KL term, a tracker's section without the tracker, a built model's size with a path
    (["algo.kl_estimator=k1"], "algo.kl_estimator", "algo.kl_coef > 0"),
    (["log.wandb.project=x"], "log.wandb.project", "wandb"),
    (["distributed.ray_placement=spread"], "distributed.ray_placement", "distributed.backend=ray"),
    (["reward.noise_std=0.3"], "reward.noise_std", "reward.noise > 0"),
    (["rollout.collector.max_gen_batches=5"], "rollout.collector.max_gen_batches", "dynamic_sampling=true"),
])
def test_a_key_the_run_would_not_read_is_refused(overrides, key, needs):
    with pytest.raises(ConfigError, match=rf"^{key}: the run would not read this key .*{needs}"):
        load_run_config(None, overrides)
    load_config(None, overrides)  # the other commands' loader does not check reads (credo sft / eval / plan)


def test_the_same_keys_are_accepted_when_their_reader_runs():
    cfg = load_run_config(None, ["critic.lr=0.01", "algo.advantage=gae", "rollout.partial=true",
                                 "rollout.max_staleness=2", "algo.kl_coef=0.1", "algo.kl_estimator=k1",
                                 "reward.noise=0.2", "reward.noise_mode=perturb", "reward.noise_std=0.3"])
    assert cfg.critic.lr == 0.01 and cfg.rollout.partial and cfg.reward.noise_std == 0.3
    # an override set to its default value is still refused: the user typed it
    with pytest.raises(ConfigError, match="^rollout.partial: "):
        load_run_config(None, ["rollout.partial=false"])


def test_keys_of_choices_sections_and_method_packages():
    # a selector key of another selector type: an unknown key of the chosen class
    with pytest.raises(ConfigError, match="for token_select.type=entropy .a key of type vepo"):
        load_run_config(None, ["token_select.type=entropy", "token_select.jsd_weight=0.5"])
    # distill.* with distillation off: the section is on once given, and then needs its teacher
    with pytest.raises(ConfigError, match="distill"):
        load_run_config(None, ["distill.coef=0.5"])
    # declarations of method packages: AttnRL's dynamic-batch keys, the agent collector's HTTP keys
    with pytest.raises(ConfigError, match=r"^rollout.collector.batch_ema: .*dynamic_batch=true"):
        load_run_config("attnrl", ["rollout.collector.dynamic_batch=false", "rollout.collector.batch_ema=0.5"])
    with pytest.raises(ConfigError, match=r"^rollout.collector.retries: .*over HTTP"):
        load_run_config(None, ["rollout.collector.type=agent", "rollout.collector.envs=[calc]",
                               "rollout.collector.retries=5"])


def test_validators_ask_for_warm_start_keys_only_when_the_run_warm_starts():
    """Regression: the gateway's verifiers check asked for warm_start.steps=0 whenever warm_start.enabled was not
    false, also with a model.path (no warm start), where credo train then refused warm_start.steps=0 as unread."""
    verifiers = ["rollout.collector.type=gateway", "rollout.collector.verifiers={env: some_env}"]
    with pytest.raises(ConfigError, match="^warm_start.steps: a verifiers environment"):
        load_run_config(None, verifiers)  # a fresh model warm-starts: the check applies
    assert load_run_config(None, [*verifiers, "model.path=/models/m"]).warm_start.steps == 100
    with pytest.raises(ConfigError, match="^warm_start.steps: the run would not read"):
        load_run_config(None, [*verifiers, "model.path=/models/m", "warm_start.steps=0"])


def test_a_harmless_key_is_a_warning(caplog):
    # a CUDA-only vLLM knob on a CPU run: vLLM's CPU build ignores it (documented on the field)
    with caplog.at_level(logging.WARNING, logger="credo.config.reads"):
        cfg = load_run_config(None, ["rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0.8"])
    assert cfg.rollout.vllm.gpu_memory_utilization == 0.8
    assert "rollout.vllm.gpu_memory_utilization: not read by this run" in caplog.text


def test_sources_and_a_run_directorys_full_config(tmp_path: Path):
    preset = tmp_path / "p.yaml"
    preset.write_text("rollout:\n  group_size: 4\n  vllm:\n    mode: inprocess\nalgo:\n  policy_loss_args: "
                      "{clip_high: 0.28}\n")
    cfg, sources = load_config_sources(str(preset), ["train.lr=0.01", "algo.policy_loss_args.clip_low=0.1"])
    assert sources["rollout.group_size"] == "preset" and sources["train.lr"] == "override"
    assert sources["algo.policy_loss_args"] == "override" and sources["seed"] == "default"
    # a preset's unread key at its default value is not refused (a full config repeats every default) ...
    assert load_run_config(str(preset)).rollout.group_size == 4
    # ... so a run directory's config.yaml, which lists every key, resumes
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_run_config(str(tmp_path / "config.yaml")).train.lr == 0.01
    # a preset's unread key with another value is refused ...
    preset.write_text("rollout:\n  vllm:\n    mode: server\n")
    with pytest.raises(ConfigError, match=r"^rollout.vllm.mode: .*\(preset 'server'\)"):
        load_run_config(str(preset))
    # ... but not from a run directory's own config on --resume (accepted when the run started, perhaps by a credo
    # that declared fewer readers): a warning; an override of the resume is still refused
    assert load_run_config(str(preset), resumed=True).rollout.vllm.mode == "server"
    with pytest.raises(ConfigError, match=r"^critic.lr: .*\(override 0.5\)"):
        load_run_config(str(preset), ["critic.lr=0.5"], resumed=True)
    # ... unless the preset reads it and an override switched its stage off: a warning (a resume with
    # distributed.backend=none over a torchrun run's config, dynamic_sampling=false over DAPO's preset)
    preset.write_text("rollout:\n  collector:\n    dynamic_sampling: true\n    max_gen_batches: 5\n")
    assert check_reads(*load_config_sources(str(preset))) == []
    cfg, sources = load_config_sources(str(preset), ["rollout.collector.dynamic_sampling=false"])
    assert sources.turned_off == {"rollout.collector.max_gen_batches"}
    assert [u.key for u in check_reads(cfg, sources)] == ["rollout.collector.max_gen_batches"]


@pytest.mark.parametrize("preset", sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml") if not p.stem.startswith("rm_")))
def test_every_shipped_preset_gives_only_keys_its_run_reads(preset):
    cfg, sources = load_config_sources(preset)
    assert check_reads(cfg, sources) == []  # no refusal, no warning


def test_unread_keys_follow_the_configuration():
    base = unread_keys(load_config(None))
    assert "rollout.vllm.mode" in base and "rollout.lean_decode" not in base and "critic.lr" in base
    vllm = unread_keys(load_config(None, ["rollout.engine=vllm", "algo.advantage=gae"]))
    assert "rollout.vllm.mode" not in vllm and "critic.lr" not in vllm
    # the HF engines beside vLLM (the warm start's evaluation) still decode through the lean loop
    assert "rollout.lean_decode" not in vllm and "model.trust_remote_code" in vllm
    assert set(leaf_keys(load_config(None))) >= set(base)


def test_credo_config_show(capsys):
    assert main(["config", "show", "--given", "train.lr=0.01", "critic.lr=0.5"]) == 2  # one key refused
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("train.lr") and "[override]" in out[0] and "not read" not in out[0]
    assert out[1].startswith("critic.lr") and "not read: only with a critic" in out[1] and "REFUSED" in out[1]
    assert main(["config", "show", "--json", "--config", "ppo"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["critic.lr"]["read"] is True and shown["rollout.vllm.url"]["read"] is False
    assert shown["algo.advantage"] == {"value": "gae", "source": "preset", "read": True, "needs": None,
                                       "refused": False, "warned": False}
    assert shown["seed"]["source"] == "default"
