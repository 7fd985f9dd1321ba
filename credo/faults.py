"""Fault injection: SIGKILL the process at a named point of a run, to prove that a kill anywhere resumes exactly
(docs/guarantees.md, "Resume"; tests/resume/test_matrix.py).

``CREDO_KILL_AT=NAME@STEP`` (or ``NAME@STEP#N``: the N-th time the point is reached with that step, default 1)
makes :func:`kill_point` send SIGKILL to its own process there: no ``finally`` block, no ``atexit`` handler, no
flush runs, as when a machine is lost or the kernel's OOM killer strikes. Several targets are separated by commas
(one process dies at the first). The variable is read once, at import; without it a point costs one dict lookup.

The points (``STEP`` as the code at the point counts it):

``generate``
    mid-generation: a rollout of the batch of RL step ``STEP`` (0-based, the step ``rl_step`` runs: its metrics
    row is ``STEP + 1``) is complete and scored or being scored, the batch is not. The single-turn collectors
    (group, tree, replay; the HF, vLLM and Ray engines) reach it each time the engine reports an output done
    (``credo.collect.group.StreamingScorer.submit``), the agent collector each time a turn of the step's episodes
    ends (``credo.rollout.agent_loop.AgentLoop.run``), the gateway collector each time one of the step's episodes
    is closed (``credo.collect.gateway.run_episodes``). In the async modes (one-step-off, bounded staleness,
    partial rollouts) the batch of step ``STEP`` is generated in the background while an earlier step trains:
    the kill lands with batches in flight.
``update``
    mid-update: after an optimizer step of the policy update of RL step ``STEP`` (``#N``: the N-th mini-batch's
    step; ``credo.train.update.update_policy``), before the step's metrics row is written.
``checkpoint``
    mid-checkpoint: checkpoint ``STEP`` (the number of RL steps done, its folder ``step_STEP``) has its model
    written into its ``.tmp-step_...`` folder, not yet its trainer state, manifest and ``COMPLETE`` marker
    (``credo.train.checkpoint.save_checkpoint``).
``latest``
    between checkpoint and pointer: checkpoint ``STEP`` is complete and renamed into place, the ``latest``
    pointer still names the previous one.

A kill between two points leaves nothing the points do not cover: a run persists only its checkpoints and its
``*.jsonl`` logs (rows after the checkpoint a resume starts from are dropped, credo.tracking.metrics).
"""
from __future__ import annotations

import os
import signal

ENV = "CREDO_KILL_AT"
POINTS = ("generate", "update", "checkpoint", "latest")


def parse(spec: str) -> dict[str, dict[int, int]]:
    """``"generate@3,update@2#2"`` -> ``{"generate": {3: 1}, "update": {2: 2}}`` (point -> step -> hit)."""
    targets: dict[str, dict[int, int]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, rest = item.partition("@")
        step, _, hit = rest.partition("#")
        if not sep or name not in POINTS or not step.isdigit() or (hit and not (hit.isdigit() and int(hit) > 0)):
            raise ValueError(f"{ENV}={spec!r}: expected NAME@STEP or NAME@STEP#N with NAME one of "
                             f"{', '.join(POINTS)} (credo/faults.py)")
        targets.setdefault(name, {})[int(step)] = int(hit or 1)
    return targets


_TARGETS = parse(os.environ.get(ENV, ""))
_HITS: dict[tuple[str, int], int] = {}


def kill_point(name: str, step: int | None) -> None:
    """SIGKILL this process if ``CREDO_KILL_AT`` names point ``name`` at ``step`` and this is the hit it names."""
    steps = _TARGETS.get(name)
    if steps is None or step not in steps:
        return
    key = (name, step)
    _HITS[key] = _HITS.get(key, 0) + 1
    if _HITS[key] == steps[step]:
        os.kill(os.getpid(), signal.SIGKILL)
