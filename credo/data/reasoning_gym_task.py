"""reasoning-gym datasets as credo tasks: ``task.name=rg:<dataset>`` (``docs/tasks.md``).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (``pip install reasoning-gym``, in credo's
``test`` extra) ships about 100 procedurally generated datasets, each with its own verifier
(``dataset.score_answer(answer, entry)``) and most with a difficulty curriculum. This module turns one into a
:class:`~credo.data.tasks.Task`::

    task = get_task("rg:chain_sum", min_terms=2, max_terms=3)            # task.params = the dataset's config
    train, eval_ = build_splits(task, train_size=1000, eval_size=100, seed=0)

- prompt = the entry's ``question``, answer (and SFT demonstration) = its ``answer``;
- ``Example.meta["rg"]`` = ``{"dataset", "config", "entry"}``: what the ``rg_score`` verifier
  (:mod:`credo.rewards.rg_score`) needs to call the dataset's own ``score_answer``;
- train and eval come from generators with different seeds (derived from the data seed); eval prompts are
  pairwise distinct and no train prompt is an eval prompt (colliding entries are dropped and topped up);
- ``curriculum={"levels": [0, 1, 2], "every": 50}`` (``task.curriculum``) generates ``train_size`` examples at each
  listed level of the dataset's curriculum (``meta["curriculum_stage"]`` = the level's position in ``levels``) and
  the eval split at the last level; :func:`credo.data.sampler.prompt_sampler` then moves to the next level every
  ``every`` batches.

reasoning_gym is imported only when an ``rg:`` task is built (importing it takes about 1 s).
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from credo.data.tasks import Task, field_defaults
from credo.types import Example

__all__ = ["CURRICULUM_KEYS", "CURRICULUM_MODES", "RgTask", "check_curriculum", "rg_param_defaults"]

CURRICULUM_MODES = ("inclusive", "upper_bound", "last_k")  # reasoning-gym's RangeAttributeMode values
CURRICULUM_KEYS = ("levels", "every", "mode", "k")
MAX_ROUNDS = 20  # generator reseeds per split before the dataset counts as too small for the requested sizes
_MANAGED = ("seed", "size")  # config fields credo sets itself


def _rg():
    """The reasoning_gym package, or an ImportError naming the extra."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError("rg: tasks need reasoning-gym: pip install 'credo[test]' (or reasoning-gym==0.1.25)") from exc
    return reasoning_gym


def _registry(dataset: str) -> tuple[type, type]:
    """``(dataset class, config class)`` of reasoning-gym dataset ``dataset``; KeyError when unknown."""
    _rg()
    import difflib

    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        close = difflib.get_close_matches(dataset, list(DATASETS), n=1)
        hint = f" (did you mean 'rg:{close[0]}'?)" if close else ""
        raise KeyError(f"unknown reasoning-gym dataset {dataset!r}{hint}; {len(DATASETS)} datasets, e.g. rg:chain_sum, "
                       "rg:basic_arithmetic, rg:leg_counting (python -c 'import reasoning_gym.factory as f; "
                       "print(sorted(f.DATASETS))')")
    return DATASETS[dataset]


def rg_param_defaults(dataset: str) -> dict[str, Any]:
    """Config field -> default of reasoning-gym dataset ``dataset`` (``task.params``), without ``seed`` and ``size``."""
    _, config_cls = _registry(dataset)
    return field_defaults(config_cls, skip=tuple(_MANAGED))


def check_curriculum(dataset: str, curriculum: dict) -> dict[str, Any]:
    """``task.curriculum`` with its defaults filled in (``mode: inclusive``, ``k: null``); ValueError naming the
    key when it is malformed or the dataset has no curriculum."""
    from reasoning_gym.factory import CURRICULA

    if not isinstance(curriculum, dict) or set(curriculum) - set(CURRICULUM_KEYS) or not {"levels", "every"} <= set(
            curriculum):
        raise ValueError(f"task.curriculum: expected {{levels: [0, 1, ...], every: N, mode: inclusive|upper_bound|"
                         f"last_k, k: N}} (levels and every required), got {curriculum!r}")
    if dataset not in CURRICULA:
        raise ValueError(f"task.curriculum: reasoning-gym dataset {dataset!r} has no curriculum")
    levels, every = curriculum["levels"], curriculum["every"]
    if not isinstance(levels, list) or not levels or not all(_is_int(x) and x >= 0 for x in levels):
        raise ValueError(f"task.curriculum.levels: expected a non-empty list of levels >= 0, got {levels!r}")
    if not _is_int(every) or every < 1:
        raise ValueError(f"task.curriculum.every: expected an int >= 1 (batches per level), got {every!r}")
    out = {"levels": list(levels), "every": every, "mode": curriculum.get("mode", "inclusive"),
           "k": curriculum.get("k")}
    if out["mode"] not in CURRICULUM_MODES:
        raise ValueError(f"task.curriculum.mode: expected one of {', '.join(CURRICULUM_MODES)}, got {out['mode']!r}")
    if out["k"] is not None and (not _is_int(out["k"]) or out["k"] < 1):
        raise ValueError(f"task.curriculum.k: expected an int >= 1 (mode last_k's window) or null, got {out['k']!r}")
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _curriculum_fields(dataset: str) -> dict[str, str]:
    """Config field -> the curriculum attribute that sets it."""
    from reasoning_gym.coaching import RangeAttributeDefinition
    from reasoning_gym.factory import create_curriculum

    out: dict[str, str] = {}
    for name, attr in create_curriculum(dataset).attributes.items():
        if isinstance(attr, RangeAttributeDefinition):
            out[attr.lower_field_name] = out[attr.upper_field_name] = name
        else:
            out[attr.field_name] = name
    return out


def level_config(dataset: str, params: dict[str, Any], curriculum: dict[str, Any], level: int) -> dict[str, Any]:
    """The dataset config (field -> value, without seed and size) at curriculum ``level``: ``params`` for the fields
    the curriculum does not set, the curriculum's values (reasoning-gym's ``generate_configuration`` with
    ``curriculum["mode"]``) for those it does. Each attribute is capped at its highest level."""
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import create_curriculum

    cur = create_curriculum(dataset)
    cur.set_global_level(level)
    context = DefaultCurriculumContext(mode=RangeAttributeMode(curriculum["mode"]), k=curriculum["k"])
    config = cur.generate_configuration(defaults=dict(params), context=context)
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _MANAGED}


def _seed(*parts: Any) -> int:
    """A 32-bit generator seed from ``parts`` (stable across processes). reasoning-gym seeds item ``i`` with
    ``seed + i``, so nearby seeds would share items; hashed seeds are ~2^31 apart on average."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big")


@dataclass
class RgTask(Task):
    """reasoning-gym dataset ``dataset`` with config ``config`` (``task.params``) and an optional curriculum."""

    default_reward: ClassVar[str] = "rg_score"

    dataset: str = "chain_sum"
    config: dict = field(default_factory=dict)
    curriculum: dict | None = None

    def __post_init__(self) -> None:
        self.name = f"rg:{self.dataset}"  # shadows the ClassVar: uids read rg:<dataset>/<split>/<index>
        known = rg_param_defaults(self.dataset)
        for key in self.config:
            if key not in known:
                raise TypeError(f"task {self.name!r} has no parameter {key!r}; it takes: {', '.join(known) or 'none'}")
        if self.curriculum:
            self.curriculum = check_curriculum(self.dataset, self.curriculum)
            taken = sorted(set(self.config) & set(_curriculum_fields(self.dataset)))
            if taken:
                raise ValueError(f"task.params.{taken[0]}: set by the curriculum of {self.name!r} (task.curriculum); "
                                 "drop it from task.params")
            self._configs = [level_config(self.dataset, self.config, self.curriculum, lv)
                             for lv in self.curriculum["levels"]]
        else:
            self._configs = [dict(self.config)]
        self._build(self._configs[-1], seed=0, size=1)  # the dataset's own validation, now

    def params(self) -> dict[str, Any]:
        return dict(self.config)

    def make_example(self, rng, index: int, split: str) -> Example:
        raise NotImplementedError("rg: tasks generate whole splits from reasoning-gym's seeded generators "
                                  "(RgTask.splits), not one example from a credo RNG")

    def _build(self, config: dict[str, Any], *, seed: int, size: int):
        try:
            return _rg().create_dataset(self.dataset, **config, seed=seed, size=size)
        except AssertionError as exc:  # reasoning-gym's config validation asserts
            raise ValueError(f"task {self.name!r}: invalid task.params {config}: {exc or 'a check failed'}") from None

    def _draw(self, split: str, stage: int, size: int, keep: Callable[[str], bool], base_seed: int) -> list[Example]:
        """``size`` examples of split ``split`` at curriculum stage ``stage`` whose prompts pass ``keep``
        (which sees each prompt once and records it if it wants to)."""
        config = self._configs[stage]
        out: list[Example] = []
        for rnd in range(MAX_ROUNDS):
            if len(out) == size:
                return out
            gen_seed = _seed("credo", self.name, split, stage, base_seed, rnd)
            for entry in self._build(config, seed=gen_seed, size=size - len(out)):
                if keep(entry["question"]):
                    out.append(self._example(entry, config, split, stage, len(out)))
        if len(out) < size:
            raise ValueError(f"task {self.name!r} with {config}: only {len(out)} of {size} distinct {split} prompts "
                             f"after {MAX_ROUNDS} generator seeds; reduce train_size/eval_size or widen task.params")
        return out

    def _example(self, entry: dict[str, Any], config: dict[str, Any], split: str, stage: int, index: int) -> Example:
        answer = entry.get("answer")
        meta: dict[str, Any] = {"rg": {"dataset": self.dataset, "config": config, "entry": entry}}
        if self.curriculum:
            meta["curriculum_stage"] = stage
            meta["curriculum_level"] = self.curriculum["levels"][stage]
        suffix = f"/level{self.curriculum['levels'][stage]}" if self.curriculum and split == "train" else ""
        return Example(prompt=str(entry["question"]), answer="" if answer is None else str(answer),
                       uid=f"{self._uid(split, index)}{suffix}", meta=meta)

    def splits(self, *, train_size: int, eval_size: int, seed: int) -> tuple[list[Example], list[Example]]:
        """Eval at the last curriculum level (or the plain config), then ``train_size`` train examples per level."""
        seen: set[str] = set()

        def distinct(prompt: str) -> bool:
            if prompt in seen:
                return False
            seen.add(prompt)
            return True

        eval_examples = self._draw("eval", len(self._configs) - 1, eval_size, distinct, seed)
        held_out = set(seen)
        train: list[Example] = []
        for stage in range(len(self._configs)):
            train += self._draw("train", stage, train_size, lambda p: p not in held_out, seed)
        return train, eval_examples
