"""The rollout engine protocol: prompts in, sampled trajectories out."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from credo.types import Example, SamplingParams, Trajectory


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that samples ``n`` responses per prompt.

    Samples of one prompt are contiguous in the output and share ``group_id`` (the prompt's index
    in ``prompts``). ``state_dict`` / ``load_state_dict`` capture the sampler's RNG so a resumed run
    samples exactly what an uninterrupted one would.
    """

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams) -> list[Trajectory]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
