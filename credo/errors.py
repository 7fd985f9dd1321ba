"""Errors that stop a run for a reason that is neither a bad configuration nor a bug, each with its own one-line
wording and exit code (``credo: LABEL: ...``; docs/security.md lists them):

- 3, ``environment failure``: more than ``rollout.collector.max_env_failure_share`` of a step's episodes failed in
  the environment (``credo.collect.agent.EnvOutageError``): the environment servers, not the config, need fixing;
- 75 (``EX_TEMPFAIL``), ``preempted``: SIGTERM / SIGUSR1 arrived; the step in progress was finished and a
  checkpoint written (``credo.recipes.preemption.Preempted``): resume with ``credo train --resume RUN``.

The bad configuration itself is a :class:`ConfigError` (exit code 2, ``credo: config error: ...``): defined here, at
the bottom of the package graph, so that any package may raise it (``credo.config`` re-exports it).

Nothing here imports anything, so the command line catches them without loading the trainer.
"""
from __future__ import annotations

EXIT_ENV_FAILURE = 3
EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL: "temporary failure, the user is invited to retry"


class RunStopped(Exception):
    """A run stopped on purpose; ``label`` and ``exit_code`` say how the command line reports it."""

    label = "stopped"
    exit_code = 1


class ConfigError(ValueError):
    """A bad configuration; the message is one line and names the key."""
