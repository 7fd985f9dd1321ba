"""Runtime guards: checks, on by default, that catch the silent failures RL frameworks have shipped.

Each guard has a name and a mode (``guards.<name>``: ``error`` raises :class:`GuardError` with a one-line message,
``warn`` logs a one-line warning, ``off`` skips the check) and a counter: ``guard/<name>_trips`` in every step's
metrics (cumulative over the run). The checks themselves live next to what they check and report here through
:meth:`Guards.check`:

- ``weight_sync``: after each sync the rollout engine serves the weights the trainer trained (a fingerprint of the
  trained parameters, LoRA adapters included, compared with the engine's; or, for a vLLM engine, its log-probs of a
  fixed probe sequence against the trainer's; credo.guards.weights);
- ``finite_logprobs``: every sampled response token has a finite behaviour log-prob (none zero-filled or NaN);
- ``first_ratio``: on an on-policy step the ratio of the first mini-batch against the sampler's log-probs is 1
  (trainer and engine agree; credo.guards.logprobs, as ``finite_logprobs``);
- ``tool_calls``: a structured-tool run whose model attempted no tool call in a step;
- ``env_failures``: environment failures never produce empty episodes silently trained on.
"""
from __future__ import annotations

import logging
from dataclasses import fields

from credo.config.schema import GUARD_MODES as MODES, GuardsConfig

log = logging.getLogger(__name__)

class GuardError(RuntimeError):
    """A runtime guard fired in ``error`` mode (the message names the guard and how to turn it into a warning)."""


class Guards:
    """The run's guards: :meth:`check` records a verdict and acts on the guard's mode; :meth:`metrics` gives the
    counters. One per run (``Parts.guards``), handed to whatever runs a check."""

    def __init__(self, cfg: GuardsConfig | None = None) -> None:
        self.cfg = cfg or GuardsConfig()
        self.trips = {f.name: 0 for f in fields(GuardsConfig) if f.metadata.get("choices") == MODES}
        self.checks = dict.fromkeys(self.trips, 0)

    def mode(self, name: str) -> str:
        if name not in self.trips:
            raise KeyError(f"unknown guard {name!r} (known: {', '.join(self.trips)})")
        return getattr(self.cfg, name)

    def enabled(self, name: str) -> bool:
        return self.mode(name) != "off"

    def check(self, name: str, ok: bool, message: str) -> bool:
        """Record one check of guard ``name``; when not ``ok``: raise (``error``) or warn (``warn``) with
        ``message``. Returns ``ok``. An ``off`` guard records nothing and returns True."""
        mode = self.mode(name)
        if mode == "off":
            return True
        self.checks[name] += 1
        if ok:
            return True
        self.trips[name] += 1
        text = f"guard {name}: {message}"
        if mode == "error":
            raise GuardError(f"{text} (guards.{name}=warn to continue anyway)")
        log.warning("%s (tripped %d times; guards.%s=off to silence)", text, self.trips[name], name)
        return False

    def metrics(self) -> dict[str, float]:
        """``guard/<name>_trips`` of every guard that ran a check, cumulative over the run."""
        return {f"guard/{n}_trips": float(t) for n, t in self.trips.items() if self.checks[n] or t}

    def state_dict(self) -> dict[str, dict[str, int]]:
        return {"trips": dict(self.trips), "checks": dict(self.checks)}

    def load_state_dict(self, state: dict[str, dict[str, int]]) -> None:
        self.trips.update(state.get("trips", {}))
        self.checks.update(state.get("checks", {}))
