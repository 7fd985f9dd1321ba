"""Issue 33 item 8: YAML alias bombs. Every YAML credo reads as configuration (a preset, a run's ``config.yaml`` on
``--resume``, a ``key=value`` override's value) goes through :mod:`credo.config.yaml_safe`, which measures what the
aliases expand to before any Python object is built and refuses past the budget in one line (exit 2).

The new module is imported inside the tests that need it, so the CLI tests fail on the old code for their own
reason (the old code reads the bomb and reports something else, or crashes).
"""
from __future__ import annotations

import time

import pytest
import yaml

from credo.cli.main import main
from credo.config import ConfigError, load_config
from credo.config.loader import REPO_CONFIGS

BOMB_LINE = "YAML aliases expand to more than 100000 nodes (an alias bomb?)"


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """The classic bomb, block style: level 0 is ``width`` strings, level k a list of ``width`` aliases of level
    k - 1. Expanded, level k has 1 + width * size(k - 1) nodes: 10, 91, 820, ... ~ 4.3e8 at level 8 (9 x 9)."""
    names = "abcdefghijklmnopqrstuvwxyz"
    lines = [f"{names[0]}: &{names[0]} [{', '.join(['lol'] * width)}]"]
    for k in range(1, levels):
        prev = names[k - 1]
        lines.append(f"{names[k]}: &{names[k]} [{', '.join(['*' + prev] * width)}]")
    return "\n".join(lines) + "\n"


def flow_bomb(levels: int = 9, width: int = 9) -> str:
    """The same bomb as one flow-style YAML value (what a ``key=value`` override can carry)."""
    items = [f"&l0 [{', '.join(['lol'] * width)}]"]
    items += [f"&l{k} [{', '.join([f'*l{k - 1}'] * width)}]" for k in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ----------------------------------------------------------------------------- through the CLI

def test_billion_laughs_preset_is_refused_at_once_in_one_line(tmp_path, capsys):
    preset = tmp_path / "bomb.yaml"
    preset.write_text(billion_laughs())
    assert len(preset.read_text()) < 1024  # about 1 KB of YAML
    t0 = time.perf_counter()
    code = main(["train", "--config", str(preset), "--run-dir", str(tmp_path / "run")])
    assert time.perf_counter() - t0 < 10.0  # the walk is one visit per distinct node: milliseconds
    assert code == 2
    assert _one_line_error(capsys) == f"credo: config error: {preset}: {BOMB_LINE}"
    assert not (tmp_path / "run").exists()


def test_billion_laughs_in_a_resumed_runs_config_yaml_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(billion_laughs())
    code = main(["train", "--resume", str(run)])
    assert code == 2
    assert _one_line_error(capsys) == f"credo: config error: {run / 'config.yaml'}: {BOMB_LINE}"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]  # nothing written


def test_alias_bomb_in_an_override_value_is_refused(tmp_path, capsys):
    # 6 levels of 9: 597871 nodes expanded (> 100000), small enough that the old code, which expands a value
    # under task.params, gets through (9 levels: killed out of memory at 23 GB after 2 minutes)
    code = main(["train", f"task.params={flow_bomb(levels=6)}", "--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert _one_line_error(capsys) == f"credo: config error: override task.params: {BOMB_LINE}"


def test_recursive_alias_is_refused(tmp_path):
    preset = tmp_path / "loop.yaml"
    preset.write_text("task:\n  params: &p {x: [1, *p]}\n")  # params contains itself: an infinite expansion
    with pytest.raises(ConfigError, match=r"loop\.yaml: a YAML alias refers to a node that contains it"):
        load_config(str(preset))


def test_nesting_past_the_recursion_limit_is_one_line(tmp_path, capsys):
    preset = tmp_path / "deep.yaml"
    preset.write_text("task:\n  params: {x: " + "[" * 3000 + "]" * 3000 + "}\n")  # ~6 KB, 3000 lists deep
    code = main(["train", "--config", str(preset), "--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert _one_line_error(capsys) == f"credo: config error: {preset}: the YAML nests too deeply"


def test_a_preset_with_legitimate_anchors_and_merge_keys_loads(tmp_path):
    preset = tmp_path / "anchors.yaml"
    preset.write_text("train: &opt {lr: 0.002, warmup_steps: 3}\n"
                      "warm_start: {<<: *opt, steps: 5}\n"  # merge key: lr and warmup_steps from train, steps here
                      "task: {params: {max_len: &n 6}}\n"
                      "seed: *n\n")
    cfg = load_config(str(preset))
    assert (cfg.train.lr, cfg.train.warmup_steps) == (0.002, 3)
    assert (cfg.warm_start.lr, cfg.warm_start.warmup_steps, cfg.warm_start.steps) == (0.002, 3, 5)
    assert cfg.task.params == {"max_len": 6} and cfg.seed == 6


# ----------------------------------------------------------------------------- the measure itself

def _size(text: str, **kw) -> int:
    from credo.config.yaml_safe import expanded_size

    return expanded_size(yaml.compose(text, Loader=yaml.SafeLoader), "t", **kw)


def test_expanded_size_by_hand():
    from credo.config.yaml_safe import YamlConfigError

    # root mapping 1 + key a 1 + [1, 2] (1 + 2 = 3) + key b 1 + [*x, *x, *x] (1 + 3 * 3 = 10) = 16
    text = "a: &x [1, 2]\nb: [*x, *x, *x]\n"
    assert _size(text) == 16
    assert _size(text, budget=16) == 16  # at the budget: accepted
    with pytest.raises(YamlConfigError, match=r"^t: YAML aliases expand to more than 15 nodes"):
        _size(text, budget=15)
    # a 250-character scalar counts 1 + 250 // 100 = 3: root 1 + key s 1 + 3 + key t 1 + [*s, *s] (1 + 3 + 3 = 7)
    assert _size(f"s: &s {'y' * 250}\nt: [*s, *s]\n") == 13


def test_billion_laughs_is_measured_without_being_expanded():
    from credo.config.yaml_safe import YamlConfigError, load_yaml

    # 5 levels of width 9: a 10, b 1 + 9 * 10 = 91, c 820, d 7381, e 66430 nodes; with keys and root
    # 1 + 5 + (10 + 91 + 820 + 7381 + 66430) = 74738: under the budget, so it loads (as shared lists)
    assert _size(billion_laughs(levels=5)) == 74738
    assert len(load_yaml(billion_laughs(levels=5))["e"]) == 9
    with pytest.raises(YamlConfigError, match="alias bomb"):
        load_yaml(billion_laughs(levels=6))  # f alone is 1 + 9 * 66430 = 597871 > 100000
    t0 = time.perf_counter()
    with pytest.raises(YamlConfigError, match="alias bomb"):
        load_yaml(billion_laughs(levels=9, width=30))  # 30^9 ~ 2e13 nodes: refused after ~300 distinct nodes
    assert time.perf_counter() - t0 < 1.0


def test_text_over_the_size_limit_is_refused_before_parsing(tmp_path):
    from credo.config.yaml_safe import MAX_YAML_CHARS, YamlConfigError, load_yaml

    with pytest.raises(YamlConfigError, match=rf"^big\.yaml: the YAML text is more than {MAX_YAML_CHARS} characters"):
        load_yaml("x: " + "y" * MAX_YAML_CHARS, "big.yaml")  # 3 characters over
    assert load_yaml("x: " + "y" * (MAX_YAML_CHARS - 3)) == {"x": "y" * (MAX_YAML_CHARS - 3)}  # exactly at the limit
    preset = tmp_path / "big.yaml"
    preset.write_text("# " + "y" * (2 * MAX_YAML_CHARS) + "\n")  # a 2 MiB comment: refused, not parsed
    with pytest.raises(ConfigError, match=r"big\.yaml: the YAML text is more than"):
        load_config(str(preset))


def test_every_preset_reads_as_yaml_safe_load_and_far_under_the_budget():
    from credo.config.yaml_safe import read_mapping

    presets = sorted(REPO_CONFIGS.glob("*.yaml"))
    assert presets
    for p in presets:
        assert read_mapping(p) == yaml.safe_load(p.read_text()), p
        assert _size(p.read_text()) < 2_000, p  # the largest preset is 129 nodes; a run's config.yaml ~450
