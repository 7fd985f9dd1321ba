"""credo.config.validate: the core checks, the validators registered beside their configs (found by module name),
and the optional sections named by "module:Class" (the schema imports no method)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from credo.config import ConfigError, RunConfig, load_config
from credo.config.validate import BUILTIN_VALIDATORS, VALIDATORS, register_validator


def test_every_builtin_module_registers_a_validator_and_none_is_registered_elsewhere():
    owners = {name: fn.__module__ for name, fn in VALIDATORS.items()}
    assert set(owners.values()) == set(BUILTIN_VALIDATORS), owners
    assert owners["distill"] == "credo.methods.distill.config"
    assert owners["rollout.async"] == "credo.distributed.validate"  # was the coordinator's check at run time
    assert owners["rollout.collector.agent"] == "credo.collect.config"


def test_config_imports_no_package_above_it():
    """Importing the config, and building one, imports no method, environment, reward or model module: the
    validators' modules are named by string and imported at the first check."""
    code = ("import sys\n"
            "from credo.config import RunConfig, ConfigError\n"
            "from credo.config.loader import build\n"
            "from credo.config.reference import reference_markdown\n"
            "cfg = build(RunConfig, {'replay': {'pool': 'p.jsonl'}}, '')\n"
            "assert type(cfg.replay).__name__ == 'ReplayConfig'\n"
            "up = ('credo.methods.vepo', 'credo.methods.distill', 'credo.envs', 'credo.rewards', 'credo.models', "
            "'credo.collect', 'credo.data', 'credo.rollout', 'credo.distributed')\n"
            "print(sorted(m for m in sys.modules if m.startswith(up)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # only the section's own module (set in the config) is imported, by its "module:Class" name
    assert out.stdout.strip() == "[]"


def test_async_modes_are_refused_when_the_config_loads():
    """The bounded-staleness refusals of the rollout coordinator now come from the loader (no model is built)."""
    for overrides, message in (
            (["rollout.partial=true"], "rollout.partial: needs rollout.max_staleness >= 1"),
            (["rollout.max_staleness=2", "rollout.engine=vllm"],
             "rollout.max_staleness >= 2 / rollout.partial: not implemented with Ray or rollout.engine=vllm"),
            (["rollout.max_staleness=2", "distributed.backend=ray"], "not implemented with Ray"),
            (["rollout.max_staleness=1", "rollout.partial=true", "rollout.collector.type=tree"],
             "rollout.partial: not implemented with rollout.collector.type=tree")):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_config(None, overrides)
    assert load_config(None, ["rollout.max_staleness=2", "rollout.partial=true"]).rollout.partial is True


def test_a_plugin_validator_runs_when_the_config_loads():
    @register_validator("test.no_seven_steps")
    def no_seven(cfg) -> None:
        if cfg.train.steps == 7:
            raise ConfigError("train.steps: 7 is refused by a plugin's validator")

    try:
        assert "test.no_seven_steps" in VALIDATORS.names()
        with pytest.raises(ConfigError, match="train.steps: 7 is refused by a plugin's validator"):
            load_config(None, ["train.steps=7"])
        assert load_config(None, ["train.steps=8"]).train.steps == 8
        with pytest.raises(ValueError, match="already registered"):  # one registration per name
            register_validator("test.no_seven_steps")(lambda cfg: None)
    finally:
        VALIDATORS.remove("test.no_seven_steps")
    assert load_config(None, ["train.steps=7"]).train.steps == 7


def test_optional_method_sections_are_named_by_module_and_class():
    from credo.methods.distill.config import DistillConfig
    from credo.methods.rlep.config import ReplayConfig

    fields = RunConfig.__dataclass_fields__
    assert fields["replay"].metadata["section"] == "credo.methods.rlep.config:ReplayConfig"
    assert fields["distill"].metadata["section"] == "credo.methods.distill.config:DistillConfig"
    assert RunConfig().replay is None and RunConfig().distill is None
    cfg = load_config(None, ["replay.pool=pool.jsonl", "distill.teacher.url=http://127.0.0.1:1"])
    assert isinstance(cfg.replay, ReplayConfig) and cfg.replay.pool == "pool.jsonl" and cfg.replay.num == 2
    assert isinstance(cfg.distill, DistillConfig) and cfg.distill.mode == "advantage"
    assert load_config(None, ["replay=null"]).replay is None
    for overrides, message in ((["replay.pol=x"], "unknown key 'replay.pol' (did you mean 'replay.pool'?)"),
                               (["distill.coef=-1", "distill.teacher.url=http://h:1"], "distill.coef: must be >= 0.0"),
                               (["replay=3"], "replay: expected a section (mapping), got 3"),
                               (["collect_negatives=true"], "did you mean 'replay.collect_negatives'")):
        with pytest.raises(ConfigError) as err:
            load_config(None, overrides)
        assert message in str(err.value)
