"""Endless, resumable prompt batches.

:class:`PromptSampler` walks a fixed list of examples epoch after epoch, reshuffling each epoch with
its own ``random.Random``. Batches may cross epoch boundaries. Its state (epoch, position in the
epoch and the RNG state from before the current epoch's shuffle) is a small JSON-serialisable dict,
so a resumed run draws exactly the batches the interrupted run would have drawn::

    sampler = PromptSampler(train, seed=0)
    batch = sampler.next_batch(32)
    state = sampler.state_dict()          # store in the checkpoint
    ...
    sampler = PromptSampler(train, seed=0)
    sampler.load_state_dict(state)        # continues where it stopped

:class:`CurriculumSampler` (``task.curriculum`` of an ``rg:`` task) holds one such sampler per difficulty
stage and draws from stage ``min(batches // every, stages - 1)``; :func:`prompt_sampler` picks the one a
run's config asks for.
"""
from __future__ import annotations

import random
from typing import Any, Iterator, Sequence

from credo.types import Example

__all__ = ["CurriculumSampler", "PromptSampler", "prompt_sampler"]

_STATE_VERSION = 1


def _rng_state_to_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state_from_json(state: Sequence[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)


class PromptSampler:
    """Yields batches of examples forever; each epoch visits every example exactly once."""

    def __init__(self, examples: Sequence[Example], *, seed: int, shuffle: bool = True) -> None:
        if len(examples) == 0:
            raise ValueError("PromptSampler needs at least one example (the task gave no training examples: "
                             "e.g. humaneval without task.params.train_problems)")
        self._examples = list(examples)
        self._seed = seed
        self._shuffle = shuffle
        self._rng = random.Random(seed)
        self._epoch = 0
        self._pos = 0
        self._epoch_rng_state = self._rng.getstate()
        self._order = self._new_order()

    # ------------------------------------------------------------------ epochs

    def _new_order(self) -> list[int]:
        """The visiting order of the current epoch; consumes RNG state when shuffling."""
        order = list(range(len(self._examples)))
        if self._shuffle:
            self._rng.shuffle(order)
        return order

    def _start_next_epoch(self) -> None:
        self._epoch += 1
        self._pos = 0
        self._epoch_rng_state = self._rng.getstate()
        self._order = self._new_order()

    @property
    def epoch(self) -> int:
        """Number of completed passes over the examples (the epoch the next example comes from)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Examples already drawn from the current epoch."""
        return self._pos

    def __len__(self) -> int:
        return len(self._examples)

    # ------------------------------------------------------------------ drawing

    def next_batch(self, n: int) -> list[Example]:
        """The next ``n`` examples (may span an epoch boundary, and repeat examples if ``n > len``)."""
        if n <= 0:
            raise ValueError(f"batch size must be positive, got {n}")
        batch: list[Example] = []
        while len(batch) < n:
            take = min(n - len(batch), len(self._order) - self._pos)
            batch.extend(self._examples[i] for i in self._order[self._pos : self._pos + take])
            self._pos += take
            if self._pos == len(self._order):
                self._start_next_epoch()
        return batch

    def batches(self, n: int) -> Iterator[list[Example]]:
        """Endless iterator of batches of ``n`` examples."""
        while True:
            yield self.next_batch(n)

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position of the sampler."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "position": self._pos,
            "num_examples": len(self._examples),
            "shuffle": self._shuffle,
            "seed": self._seed,
            "epoch_rng_state": _rng_state_to_json(self._epoch_rng_state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the sampler must hold the same examples in the same order."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported PromptSampler state version {state.get('version')!r}")
        if state["num_examples"] != len(self._examples):
            raise ValueError(
                f"PromptSampler state is for {state['num_examples']} examples, this sampler has {len(self._examples)}"
            )
        if not 0 <= state["position"] < state["num_examples"]:
            raise ValueError(f"PromptSampler state has invalid position {state['position']!r}")
        self._shuffle = bool(state["shuffle"])
        self._seed = state["seed"]
        self._epoch = int(state["epoch"])
        self._pos = int(state["position"])
        self._epoch_rng_state = _rng_state_from_json(state["epoch_rng_state"])
        self._rng.setstate(self._epoch_rng_state)
        self._order = self._new_order()  # replays this epoch's shuffle, leaving the RNG where it was


class CurriculumSampler:
    """Batches from difficulty stages in order: stage ``min(b // every, len(stages) - 1)`` serves the ``b``-th
    batch (0-based), each stage from its own :class:`PromptSampler` (seed ``seed + stage``). With the group
    collector one batch is one RL step, so stage ``s`` trains steps ``[s * every, (s + 1) * every)``; dynamic
    sampling's extra batches count too."""

    def __init__(self, stages: Sequence[Sequence[Example]], *, every: int, seed: int) -> None:
        if not stages or isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"CurriculumSampler needs at least one stage and every >= 1, got {len(stages)} stages, "
                             f"every={every!r}")
        self._samplers = [PromptSampler(exs, seed=seed + i) for i, exs in enumerate(stages)]
        self._every = every
        self._batches = 0

    @property
    def stage(self) -> int:
        """The stage the next batch comes from."""
        return min(self._batches // self._every, len(self._samplers) - 1)

    def __len__(self) -> int:
        return sum(len(s) for s in self._samplers)

    def next_batch(self, n: int) -> list[Example]:
        """The next ``n`` examples, all from the current stage."""
        batch = self._samplers[self.stage].next_batch(n)
        self._batches += 1
        return batch

    def batches(self, n: int) -> Iterator[list[Example]]:
        """Endless iterator of batches of ``n`` examples."""
        while True:
            yield self.next_batch(n)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position: batches drawn and every stage's sampler state."""
        return {"version": _STATE_VERSION, "curriculum": True, "batches": self._batches, "every": self._every,
                "stages": [s.state_dict() for s in self._samplers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a sampler with the same stages (same sizes, same order)."""
        if not state.get("curriculum") or len(state.get("stages", [])) != len(self._samplers):
            raise ValueError(f"sampler state is not that of a {len(self._samplers)}-stage curriculum sampler "
                             "(task.curriculum changed since the checkpoint?)")
        for sampler, sub in zip(self._samplers, state["stages"]):
            sampler.load_state_dict(sub)
        self._batches = int(state["batches"])
        self._every = int(state["every"])


def prompt_sampler(examples: Sequence[Example], *, seed: int, curriculum: dict | None = None):
    """The run's training sampler: a :class:`PromptSampler` over ``examples``, or with ``curriculum``
    (``task.curriculum``: ``every`` batches per stage) a :class:`CurriculumSampler` over the examples grouped by
    ``meta["curriculum_stage"]`` (set by ``rg:`` tasks, :mod:`credo.data.reasoning_gym_task`)."""
    if not curriculum:
        return PromptSampler(examples, seed=seed)
    stages: dict[int, list[Example]] = {}
    for ex in examples:
        if "curriculum_stage" not in ex.meta:
            raise ValueError(f"task.curriculum: example {ex.uid} has no curriculum stage (only rg:<dataset> tasks "
                             "have curricula)")
        stages.setdefault(int(ex.meta["curriculum_stage"]), []).append(ex)
    if sorted(stages) != list(range(len(stages))):
        raise ValueError(f"task.curriculum: training examples cover stages {sorted(stages)}, expected "
                         f"0..{len(stages) - 1}")
    return CurriculumSampler([stages[i] for i in range(len(stages))], every=curriculum["every"], seed=seed)
