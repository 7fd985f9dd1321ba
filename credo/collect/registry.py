"""The collector extension point: ``rollout.collector.type`` -> a builder, and collector wrappers (a method that
mixes its rows into another collector's, e.g. RLEP's replay), each registered once by the package that owns it.

    register_collector("my_collector", MyCollectorConfig, build)   # one call: the rollout.collector option
                                                                   # (its config dataclass) and its builder
    register_collector("my_collector", MyCollectorConfig, build,   # optionally its own task rows (default:
                       data=task_data, evaluate=evaluate)          # task.*) and its own held-out evaluation

    @COLLECTOR_WRAPPERS.register("my_wrapper")      # returns ``inner`` unchanged when its config leaves it off
    def wrap(x: CollectorInputs, inner: Collector) -> Collector: ...

Built-ins: ``group``, ``agent`` and ``gateway`` (credo.collect.builtin), ``tree`` (AttnRL, credo.methods.attnrl.collector) and
the ``replay`` wrapper (RLEP, credo.methods.rlep.collector), found by module name; their config classes are named
by ``"module:Class"`` in credo.config.schema.COLLECTORS, so loading a config imports none of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from credo.collect.base import Collector
from credo.registry import Registry


@dataclass(frozen=True)
class CollectorInputs:
    """What a collector may be built from (each builder takes what it uses)."""

    cfg: Any  # the RunConfig
    engine: Any
    runner: Any  # the verifier runner (None for agent runs and on Ray follower ranks)
    model: Any  # the policy
    tokenizer: Any
    data: Any  # TaskData
    sampler: Any  # the prompt sampler (this rank's share when rollouts are sharded)
    run_dir: Path
    guards: Any = None  # the run's credo.guards.Guards (the agent collector checks tool_calls / env_failures)
    runner_for: Callable[[int], Any] | None = None  # step -> the runner scoring its training rollouts (reward noise)


COLLECTORS: Registry[Callable[[CollectorInputs], Collector]] = Registry(
    "collector", builtins=("credo.collect.builtin", "credo.methods.attnrl.collector"))
# type -> data(cfg, seed) -> TaskData: a collector whose task rows are not task.*'s (the agent collector's environment
# tasks, a verifiers environment's rows); a type without one reads task.* (credo.data.source.load_task_data)
COLLECTOR_DATA: Registry[Callable[[Any, int], Any]] = Registry("collector task data", builtins=("credo.collect.builtin",))
# type -> evaluate(cfg, engine, runner, examples, *, seed, samples_path) -> metrics: a collector whose held-out
# evaluation is not single-turn generation scored by the verifier (credo.collect.evaluate.evaluate)
COLLECTOR_EVALS: Registry[Callable[..., dict]] = Registry("collector evaluation", builtins=("credo.collect.builtin",))
COLLECTOR_WRAPPERS: Registry[Callable[[CollectorInputs, Collector], Collector]] = Registry(
    "collector wrapper", builtins=("credo.methods.rlep.collector",))


def register_collector(name: str, config: type | str, build: Callable[[CollectorInputs], Collector], *,
                       data: Callable[[Any, int], Any] | None = None,
                       evaluate: Callable[..., dict] | None = None) -> None:
    """A new ``rollout.collector.type``: its config dataclass (a ``type_key(name)`` field and its own keys; or its
    ``"module:Class"``) as the option of the choice, and its builder; ``data(cfg, seed) -> TaskData`` when its task
    rows are not ``task.*``'s, ``evaluate(cfg, engine, runner, examples, *, seed, samples_path) -> metrics`` when its
    held-out evaluation is not the single-turn one."""
    from credo.config.fields import register_choice
    from credo.config.schema import COLLECTORS as OPTIONS

    COLLECTORS.add(name, build)
    register_choice(OPTIONS, name, config)
    if data is not None:
        COLLECTOR_DATA.add(name, data)
    if evaluate is not None:
        COLLECTOR_EVALS.add(name, evaluate)


def collector_task_data(cfg: Any, seed: int):
    """The run's TaskData: the collector's own (``register_collector(..., data=)``), else ``task.*``'s."""
    kind = cfg.rollout.collector.type
    if kind in COLLECTOR_DATA:
        return COLLECTOR_DATA.get(kind)(cfg, seed)
    from credo.data.source import load_task_data

    return load_task_data(cfg.task, seed=seed)


def build_collector(x: CollectorInputs) -> Collector:
    """``rollout.collector.type``'s collector, passed through every registered wrapper (in name order)."""
    kind = x.cfg.rollout.collector.type
    if kind not in COLLECTORS:
        raise NotImplementedError(f"rollout.collector.type={kind}: a config option without a collector; register "
                                  f"a builder with credo.collect.registry.COLLECTORS (docs/extending.md)")
    collector = COLLECTORS.get(kind)(x)
    for _, wrap in COLLECTOR_WRAPPERS.items():
        collector = wrap(x, collector)
    return collector
