"""The rollout engine protocol: prompts in, sampled trajectories out."""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from credo.types import Example, SamplingParams, Trajectory

OnDone = Callable[[int, Trajectory], None]


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that samples ``n`` responses per prompt.

    Samples of one prompt are contiguous in the output and share ``group_id`` (the prompt's index
    in ``prompts``). ``state_dict`` / ``load_state_dict`` capture the sampler's RNG so a resumed run
    samples exactly what an uninterrupted one would.

    ``on_done(index, trajectory)``, when given, is called as soon as output ``index`` is complete (possibly
    from the generating thread, before ``generate`` returns), so rewards can be computed while the rest of the
    batch is still being generated; an engine that cannot stream calls it for every output at the end.
    """

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams,
                 on_done: OnDone | None = None) -> list[Trajectory]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
