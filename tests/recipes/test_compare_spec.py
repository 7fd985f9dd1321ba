"""credo.recipes.compare_spec: spec files, their errors, and the overrides of each run."""
from types import SimpleNamespace

import pytest

from credo.recipes.compare_spec import SpecError, compare_spec_of, load_spec, spec_from_dict

SPEC = {"name": "t", "baseline": "a", "seeds": 3, "budget": {"unit": "trained_tokens", "value": 500},
        "overrides": ["train.threads=1"], "arms": {"a": {"preset": "grpo"},
                                                 "b": {"preset": "gppo", "overrides": ["algo.sft_coef=0"]}},
        "metrics": [{"key": "eval/greedy_acc", "reduce": "final"}, {"key": "actor/entropy", "reduce": "last:0.25"}]}


def test_run_overrides_put_spec_arm_budget_and_seed_in_order():
    spec = spec_from_dict(SPEC)
    assert spec.seeds == (0, 1, 2) and spec.baseline == "a" and [m.id for m in spec.metrics] == [
        "eval/greedy_acc@final", "actor/entropy@last:0.25"]
    assert spec.run_overrides("b", 2) == ["train.threads=1", "algo.sft_coef=0", "train.budget=trained_tokens",
                                          "train.budget_value=500", "seed=2"]
    steps = spec_from_dict({**SPEC, "budget": {"unit": "steps", "value": 40}})
    assert steps.run_overrides("a", 0)[-2:] == ["train.steps=40", "seed=0"]
    assert spec_from_dict({"arms": {"x": "grpo"}}).seeds == (0, 1, 2, 3, 4)  # five seeds by default


def test_digest_changes_with_what_the_runs_depend_on_only():
    spec = spec_from_dict(SPEC)
    assert spec_from_dict({**SPEC, "jobs": 2, "name": "other"}).digest() == spec.digest()
    assert spec_from_dict({**SPEC, "seeds": 4}).digest() != spec.digest()
    assert spec_from_dict({**SPEC, "overrides": ["train.threads=2"]}).digest() != spec.digest()


@pytest.mark.parametrize("patch,match", [
    ({"baseline": "z"}, "baseline"), ({"seeds": 0}, "seeds"), ({"seeds": [1, 1]}, "seeds"),
    ({"budget": {"unit": "tokens", "value": 3}}, "budget"), ({"budget": {"unit": "steps", "value": 2.5}}, "whole"),
    ({"arms": {"../x": {"preset": "grpo"}}}, "label"), ({"arms": {"a": {"preset": "grpo", "lr": 1}}}, "arms.a"),
    ({"metrics": [{"key": "x", "reduce": "median"}]}, "unknown reduction"), ({"colour": 1}, "unknown spec key"),
    ({"overrides": ["train.steps"]}, "key=value"), ({"jobs": 0}, "jobs"),
])
def test_bad_specs_are_one_line_errors(patch, match):
    with pytest.raises(SpecError, match=match):
        spec_from_dict({**SPEC, **patch})


def test_load_spec_reports_yaml_errors_with_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("arms: [\n")
    with pytest.raises(SpecError, match="bad.yaml"):
        load_spec(bad)
    good = tmp_path / "mine.yaml"
    good.write_text("arms: {a: grpo, b: gppo}\n")
    assert load_spec(good).name == "mine"  # the file's stem names it


def _args(**kw):
    base = dict(spec=None, presets=None, baseline=None, seeds=None, jobs=None, budget=None, target=None)
    return SimpleNamespace(**{**base, **kw})


def test_command_line_flags():
    spec = compare_spec_of(_args(presets="grpo,gppo", seeds=6, budget="sampled_tokens:1000", baseline="gppo",
                                 target=0.5))
    assert list(spec.arms) == ["grpo", "gppo"] and spec.baseline == "gppo" and len(spec.seeds) == 6
    assert (spec.budget_unit, spec.budget_value) == ("sampled_tokens", 1000.0)
    assert spec.metrics[-1].id == "eval/greedy_acc@steps_to:0.5"
    for bad in (_args(), _args(presets="grpo,grpo"), _args(presets="grpo", budget="tokens:3"),
                _args(presets="grpo", baseline="x")):
        with pytest.raises(SpecError):
            compare_spec_of(bad)
