"""Trainer states of older credo versions, upgraded to the current layout: one function, one step per version.

The RL trainer state of a checkpoint (``credo.recipes.rlvr.trainer_state``) records ``format_version``, an int:
:data:`FORMAT_VERSION` for the layout this code writes. A resume calls :func:`migrate_trainer_state` once, on the
state it loads (``credo.recipes.rlvr.restore``), whatever the checkpoint's storage (JSON + safetensors, or a
pickled ``trainer_state.pt`` of a pre-manifest checkpoint, :mod:`credo.train.checkpoint`). It applies
:data:`STEPS` one version at a time (0 -> 1 -> ... -> current), so that restore, the collector and the rollout
coordinator read the current layout only. A state of a newer version than this code knows is refused in one line
naming both versions. Each step rewrites plain dicts and names its keys literally (a step describes the layout of
its time, so a later rename is a later step, never an edit of this one).

Versions
--------
0  No ``format_version``: every state written before the field existed (issue 33's f61edf6 and all earlier
   commits, pickled pre-manifest states included). The layout grew over that history; step 0 -> 1 gives every such state
   what it lacks (the commit that changed each part in brackets):

   - the collector's state under ``collector`` [053b208, the collector seam]: before it, the prompt samplers
     (``sampler``, ``stage_samplers`` [ff2eeef]), RLEP's ``replay`` [b19c6af] and AttnRL's run-state field
     ``run.attnrl`` [b19c6af] sat at the top level / in the run state; they are gathered into ``collector``;
   - the one-step-off batch in flight (``pending_rollouts`` [e5a40ed], None before) records the sampling it was
     drawn with [053b208]; an older one gets the sampling of the resumed run's config (``sampling=``);
   - ``async_pipeline`` (the bounded-staleness pipeline [36d6249]): None before;
   - ``guards`` (runtime guard counters [e1d7195]): none counted before;
   - the run state's ``bad_rows`` [4e7ea39] and ``entropy_history`` [489abc6]: 0 and [] before.
1  The layout of :data:`LAYOUT` with ``format_version: 1``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from credo.train.checkpoint import CheckpointError

FORMAT_VERSION = 1
KEY = "format_version"
# the keys of the current layout: always present, the critic's two when the run trains a critic
LAYOUT = ("format_version", "run", "optimizer", "scheduler", "rng", "engine", "pending_rollouts", "async_pipeline",
          "collector", "guards")
CRITIC_KEYS = ("critic_optimizer", "critic_scheduler")


def migrate_trainer_state(saved: dict[str, Any], *, sampling: Any = None) -> dict[str, Any]:
    """``saved`` (a trainer state of any version, not modified) in the current layout (module docstring).
    ``sampling``: the resumed run's :class:`credo.types.SamplingParams`, given to a batch in flight saved before
    rollouts recorded theirs. :class:`CheckpointError` for a newer or malformed version, or a state that lacks a
    key of the current layout after the steps."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"the trainer state is a {type(saved).__name__}, not a mapping")
    version = saved.get(KEY, 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise CheckpointError(f"the trainer state's {KEY} is {version!r}, not a version number")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"the trainer state has {KEY} {version}, newer than this credo's {FORMAT_VERSION}: "
                              f"resume it with the credo that wrote it (or a newer one)")
    state = dict(saved)
    for v in range(version, FORMAT_VERSION):
        state = STEPS[v](state, sampling=sampling)
        state[KEY] = v + 1
    missing = [k for k in LAYOUT if k not in state]
    if missing:
        raise CheckpointError(f"the trainer state (version {version}) lacks {', '.join(missing)}")
    return state


def _v0_to_v1(saved: dict[str, Any], *, sampling: Any) -> dict[str, Any]:
    """Version 0 (no ``format_version``; module docstring) -> 1."""
    if not isinstance(saved.get("run"), dict):
        raise CheckpointError("the trainer state (version 0) has no run state")
    saved = dict(saved)
    saved["run"] = run = {"bad_rows": 0, "entropy_history": []} | saved["run"]
    attnrl = run.pop("attnrl", None)  # AttnRL's state, in the collector's since the seam
    if "collector" not in saved:  # written before the collector seam
        saved["collector"] = {"sampler": saved.pop("sampler", None),
                              "stage_samplers": saved.pop("stage_samplers", None) or [],
                              "replay": saved.pop("replay", None), "attnrl": dict(attnrl or {})}
    pending = saved.get("pending_rollouts")
    if pending is not None and getattr(pending, "sampling", None) is None:
        if sampling is None:
            raise CheckpointError("the trainer state's batch in flight was saved before rollouts recorded their "
                                  "sampling; migrating it needs the run's sampling (sampling=)")
        pending = dataclasses.replace(pending, sampling=sampling)
    saved["pending_rollouts"] = pending
    saved.setdefault("async_pipeline", None)
    saved.setdefault("guards", {})
    return saved


# STEPS[v] upgrades a version-v state to version v + 1
STEPS: dict[int, Callable[..., dict[str, Any]]] = {0: _v0_to_v1}
