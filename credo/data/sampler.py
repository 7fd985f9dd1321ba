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
"""
from __future__ import annotations

import random
from typing import Any, Iterator, Sequence

from credo.types import Example

__all__ = ["PromptSampler"]

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
            raise ValueError("PromptSampler needs at least one example")
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
