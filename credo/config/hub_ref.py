"""Hugging Face hub ids in config values: ``org/name`` with an optional ``@revision`` (a branch, tag or commit).

:func:`parse_hub_id` only parses (no file system, no network): the config loader uses it to leave a hub id in a
preset as it is (not a path relative to the preset), and :mod:`credo.models.hub` / :mod:`credo.data.hub` resolve
what it returns (docs/bring-your-own.md). A value that is an existing local path is never a hub id: the callers
check the path first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# huggingface_hub's repo-id rule (validate_repo_id), narrowed to the two-part form: namespace/name, each of letters,
# digits, '-', '_', '.', at most 96 characters in all, no '--' or '..', not starting or ending with '-' or '.'
_PART = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_REVISION = re.compile(r"[\w.][\w./-]*")


@dataclass(frozen=True)
class HubId:
    """A repository on the hub and the revision asked for (None = the default branch, ``main``)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id


def parse_hub_id(value: object) -> HubId | None:
    """``org/name`` or ``org/name@revision`` as a :class:`HubId`; None for anything else (a path that starts with
    ``/``, ``.`` or ``~``, has more than two parts, an empty revision, ``--`` or ``..`` in the id)."""
    if not isinstance(value, str):
        return None
    repo_id, at, revision = value.strip().partition("@")
    if at and not _REVISION.fullmatch(revision):
        return None
    if not _REPO_ID.fullmatch(repo_id) or len(repo_id) > 96 or "--" in repo_id or ".." in repo_id \
            or repo_id.endswith(".git"):
        return None
    return HubId(repo_id, revision or None)
