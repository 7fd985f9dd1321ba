"""What a ``credo compare`` runs: arms x seeds under one budget, and the metrics it summarises (docs/evidence.md).

A spec is a YAML file (or built from ``--presets``)::

    name: gppo_clip_grad
    baseline: grpo                      # an arm; every other arm's paired difference is taken against it
    seeds: 5                            # seeds 0..4, or a list [0, 3, 7]
    budget: {unit: trained_tokens, value: 20000}   # steps | sampled_tokens | trained_tokens | wall_s
    jobs: 1                             # runs at once (CPU threads are split between them)
    overrides: [train.threads=1]        # every arm, before the arm's own
    arms:
      grpo: {preset: grpo}
      gppo: {preset: gppo, overrides: [algo.policy_loss_args.clip_high=0.28]}
    metrics:
      - {key: eval/greedy_acc, reduce: final}
      - {key: actor/entropy, reduce: slope}

``budget.unit: steps`` sets ``train.steps``; another unit sets ``train.budget`` / ``train.budget_value`` and keeps
``train.steps`` (from the overrides or the preset) as an upper bound.
"""
from __future__ import annotations

import hashlib
import json
import re
import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from credo.config import ConfigError
from credo.config.yaml_safe import read_mapping
from credo.report.series import check_reduce

UNITS = ("steps", "sampled_tokens", "trained_tokens", "wall_s")
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
DEFAULT_METRICS = (("eval/greedy_acc", "final"), ("eval/greedy_acc", "mean"), ("actor/entropy", "final"),
                   ("actor/entropy", "slope"))


class SpecError(ConfigError):
    """A compare spec that cannot run: one line naming the field (``credo compare`` exits 2)."""


@dataclass(frozen=True)
class Arm:
    preset: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Metric:
    key: str
    reduce: str = "final"

    @property
    def id(self) -> str:
        return f"{self.key}@{self.reduce}"


@dataclass(frozen=True)
class CompareSpec:
    name: str
    arms: dict[str, Arm]
    baseline: str
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    budget_unit: str = "steps"
    budget_value: float | None = None  # None: train.steps as configured
    jobs: int = 1
    overrides: tuple[str, ...] = ()
    metrics: tuple[Metric, ...] = field(default_factory=lambda: tuple(Metric(k, r) for k, r in DEFAULT_METRICS))

    def run_overrides(self, arm: str, seed: int) -> list[str]:
        """The ``key=value`` list of one run: the spec's, the arm's, the budget's, the seed."""
        out = [*self.overrides, *self.arms[arm].overrides]
        if self.budget_value is not None:
            if self.budget_unit == "steps":
                out.append(f"train.steps={int(self.budget_value)}")
            else:
                out += [f"train.budget={self.budget_unit}", f"train.budget_value={self.budget_value:g}"]
        return [*out, f"seed={seed}"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["arms"] = {k: {"preset": a.preset, "overrides": list(a.overrides)} for k, a in self.arms.items()}
        d["metrics"] = [{"key": m.key, "reduce": m.reduce} for m in self.metrics]
        d["seeds"], d["overrides"] = list(self.seeds), list(self.overrides)
        return d

    def digest(self) -> str:
        """What the runs depend on (not jobs, metrics or name): a changed digest means the runs in OUT are stale."""
        d = self.to_dict()
        core = {k: d[k] for k in ("arms", "seeds", "budget_unit", "budget_value", "overrides")}
        return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def _strs(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise SpecError(f"{where}: expected a list of key=value strings, got {value!r}")
    return tuple(value)


def _seeds(value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return tuple(range(value))
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                 for s in value) and len(set(value)) == len(value):
        return tuple(value)
    raise SpecError(f"seeds: expected a count >= 1 or a list of distinct seeds >= 0, got {value!r}")


def _arms(value: Any) -> dict[str, Arm]:
    if not isinstance(value, dict) or not value:
        raise SpecError("arms: expected a mapping label -> {preset, overrides}")
    arms = {}
    for label, arm in value.items():
        if not isinstance(label, str) or not LABEL.match(label):
            raise SpecError(f"arms: {label!r} is not a label (letters, digits, _ . + -; it names a directory)")
        if isinstance(arm, str):
            arm = {"preset": arm}
        if not isinstance(arm, dict) or not isinstance(arm.get("preset"), str) or set(arm) - {"preset", "overrides"}:
            raise SpecError(f"arms.{label}: expected {{preset: NAME, overrides: [k=v, ...]}}, got {arm!r}")
        arms[label] = Arm(arm["preset"], _strs(arm.get("overrides"), f"arms.{label}.overrides"))
    return arms


def _metrics(value: Any) -> tuple[Metric, ...]:
    if value is None:
        return tuple(Metric(k, r) for k, r in DEFAULT_METRICS)
    if not isinstance(value, list) or not value:
        raise SpecError("metrics: expected a list of {key, reduce}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("key"), str) or set(m) - {"key", "reduce"}:
            raise SpecError(f"metrics[{i}]: expected {{key: METRIC, reduce: final}}, got {m!r}")
        try:
            out.append(Metric(m["key"], check_reduce(str(m.get("reduce", "final")))))
        except ValueError as exc:
            raise SpecError(f"metrics[{i}]: {exc}") from None
    return tuple(out)


def _budget(value: Any) -> tuple[str, float | None]:
    if value is None:
        return "steps", None
    if not isinstance(value, dict) or value.get("unit") not in UNITS or set(value) - {"unit", "value"} \
            or not isinstance(value.get("value"), (int, float)) or isinstance(value.get("value"), bool) \
            or value["value"] <= 0:
        raise SpecError(f"budget: expected {{unit: {' | '.join(UNITS)}, value: > 0}}, got {value!r}")
    if value["unit"] == "steps" and value["value"] != int(value["value"]):
        raise SpecError(f"budget: a steps budget is a whole number, got {value['value']}")
    return value["unit"], float(value["value"])


def spec_from_dict(data: Any, *, default_name: str = "compare") -> CompareSpec:
    if not isinstance(data, dict):
        raise SpecError("a compare spec is a mapping (name, baseline, seeds, budget, arms, metrics)")
    known = {"name", "baseline", "seeds", "budget", "jobs", "overrides", "arms", "metrics", "description"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(f"unknown spec key(s) {', '.join(unknown)}: known are {', '.join(sorted(known))}")
    arms = _arms(data.get("arms"))
    baseline = data.get("baseline", next(iter(arms)))
    if baseline not in arms:
        raise SpecError(f"baseline: {baseline!r} is not an arm ({', '.join(arms)})")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not LABEL.match(name):
        raise SpecError(f"name: {name!r} is not a name (letters, digits, _ . + -)")
    jobs = data.get("jobs", 1)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise SpecError(f"jobs: expected an integer >= 1, got {jobs!r}")
    unit, value = _budget(data.get("budget"))
    return CompareSpec(name=name, arms=arms, baseline=baseline, seeds=_seeds(data.get("seeds", 5)),
                       budget_unit=unit, budget_value=value, jobs=jobs,
                       overrides=_strs(data.get("overrides"), "overrides"), metrics=_metrics(data.get("metrics")))


def load_spec(path: Path | str) -> CompareSpec:
    path = Path(path)
    try:
        data = read_mapping(path)  # bounded safe YAML: malformed text is one line with its position
    except OSError as exc:
        raise SpecError(f"cannot read compare spec {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return spec_from_dict(data, default_name=path.stem)


def label(preset: str) -> str:
    """A preset's label: the preset, or a YAML file's stem."""
    return Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset


def compare_spec_of(args: Any) -> CompareSpec:
    """The spec of a ``credo compare`` command line: a spec file, or ``--presets``; flags override the file."""
    if bool(args.spec) == bool(args.presets):
        raise SpecError("credo compare: give a spec file or --presets (not both)")
    if args.spec:
        spec = load_spec(args.spec)
    else:
        presets = [p.strip() for p in args.presets.split(",") if p.strip()]
        labels = [label(p) for p in presets]
        if not presets or len(set(labels)) != len(labels):
            raise SpecError(f"--presets: expected distinct presets, got {args.presets!r}")
        spec = spec_from_dict({"name": "_vs_".join(labels)[:64] if LABEL.match("_vs_".join(labels)[:64]) else "compare",
                               "arms": {lb: {"preset": p} for lb, p in zip(labels, presets)}})
    changes: dict[str, Any] = {}
    if args.baseline:
        if args.baseline not in spec.arms:
            raise SpecError(f"--baseline: {args.baseline!r} is not an arm ({', '.join(spec.arms)})")
        changes["baseline"] = args.baseline
    if args.seeds is not None:
        changes["seeds"] = _seeds(args.seeds)
    if args.jobs is not None:
        if args.jobs < 1:
            raise SpecError(f"--jobs: expected >= 1, got {args.jobs}")
        changes["jobs"] = args.jobs
    if args.budget:
        unit, _, value = args.budget.partition(":")
        try:
            changes["budget_unit"], changes["budget_value"] = _budget({"unit": unit, "value": float(value)})
        except ValueError:
            raise SpecError(f"--budget: expected UNIT:VALUE ({' | '.join(UNITS)}), got {args.budget!r}") from None
    if args.target is not None:
        changes["metrics"] = (*spec.metrics, Metric("eval/greedy_acc", check_reduce(f"steps_to:{args.target}")))
    return dataclasses.replace(spec, **changes)
