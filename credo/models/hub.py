"""Model paths by hub id: ``model.path``, ``critic.path``, ``distill.teacher.path`` and reward-model paths accept
``org/name`` or ``org/name@revision`` as well as a local directory (docs/bring-your-own.md).

:func:`resolve_model_path` is the one resolver: an existing local path wins and is returned unchanged (its
loader's own errors apply, as before); a value that parses as a hub id (:func:`credo.config.hub_ref.parse_hub_id`)
is resolved with ``huggingface_hub.snapshot_download`` to a snapshot directory of the hub cache
(``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``): online it downloads what is missing
(the config, tokenizer and ``*.safetensors`` files: :data:`ALLOW_PATTERNS`), with ``HF_HUB_OFFLINE=1`` it reads
the cache alone, and a miss is a :class:`HubModelNotFound` (a ``FileNotFoundError``) naming the id, the revision,
the cache directory and the command that fetches it.

:func:`pin` turns a hub id into ``org/name@<commit>`` of the snapshot it resolved to: a run records that in its
``config.yaml`` (credo.recipes.preflight.pin_hub_ids), so a resumed run, ``credo eval`` and ``credo export``
read the same weights even after the branch moved. :func:`hub_origin` says which repository and commit a
snapshot directory holds (a LoRA adapter's base record names it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from credo.config.hub_ref import HubId, parse_hub_id

# what a policy / critic / reward model needs from a model repository: its config, tokenizer (json, sentencepiece,
# tiktoken, merges / vocab text, chat-template files) and safetensors weights (no .bin / .pt pickles, no .gguf,
# no other formats' copies). Remote code (*.py) only with model.trust_remote_code.
ALLOW_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja")
CODE_PATTERNS = ("*.py",)


class HubModelNotFound(FileNotFoundError):
    """A hub id that is neither in the hub cache (offline) nor on the hub (online)."""


@dataclass(frozen=True)
class HubOrigin:
    """The repository and commit a snapshot directory of the hub cache holds."""

    repo_id: str
    commit: str

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.commit}"


def hub_cache_dir() -> Path:
    """The hub cache as huggingface_hub finds it, read from the environment now (``HF_HUB_CACHE``, the older
    ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, ``XDG_CACHE_HOME/huggingface/hub``, ``~/.cache/huggingface/hub``)."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to a true value, read from the environment now."""
    return any(os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_id_of(spec: str | os.PathLike | None) -> HubId | None:
    """The hub id ``spec`` names, or None when it is unset, an existing local path, or not a hub id."""
    if spec is None or not str(spec) or Path(str(spec)).expanduser().exists():
        return None
    return parse_hub_id(str(spec))


def resolve_model_path(spec: str | os.PathLike, *, key: str = "model.path", trust_remote_code: bool = False,
                       repo_type: str = "model") -> Path:
    """The local directory of ``spec``: ``spec`` itself when it exists locally or is not a hub id (the caller's
    loader then says what is wrong with it), else the hub snapshot it names (module docstring). ``key`` names the
    config key in errors; ``trust_remote_code`` also fetches the repository's ``*.py`` files."""
    ref = hub_id_of(spec)
    if ref is None:
        return Path(str(spec)).expanduser()
    patterns = list(ALLOW_PATTERNS + (CODE_PATTERNS if trust_remote_code else ()))
    return snapshot(ref, key=key, allow_patterns=patterns, repo_type=repo_type)


def snapshot(ref: HubId, *, key: str, allow_patterns: list[str] | None, repo_type: str = "model") -> Path:
    """``snapshot_download`` of ``ref`` into the hub cache (offline: from it alone); a miss is a
    :class:`HubModelNotFound` saying what is missing where, and how to fetch it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    cache, offline = hub_cache_dir(), hub_offline()
    try:
        from huggingface_hub.errors import IncompleteSnapshotError
    except ImportError:  # older huggingface_hub: no completeness check of cached snapshots
        IncompleteSnapshotError = LocalEntryNotFoundError  # noqa: N806
    try:
        path = snapshot_download(ref.repo_id, revision=ref.revision, repo_type=repo_type, cache_dir=cache,
                                 allow_patterns=allow_patterns, local_files_only=offline)
    except (LocalEntryNotFoundError, IncompleteSnapshotError) as exc:
        raise HubModelNotFound(not_found_message(ref, key, cache, offline, exc)) from None
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as exc:
        what = f"revision {ref.revision}" if isinstance(exc, RevisionNotFoundError) else "repository"
        raise HubModelNotFound(f"{_not_local(key, ref)}, nor a model on the hub: the hub has no such {what} of "
                               f"{ref.repo_id} or denies access ({type(exc).__name__}; a private or gated "
                               "repository needs HF_TOKEN or `hf auth login`)") from None
    except HfHubHTTPError as exc:
        raise HubModelNotFound(f"{_not_local(key, ref)}, and the hub answered {_first_line(exc)} for "
                               f"{ref.repo_id}") from None
    return Path(path)


def _not_local(key: str, ref: HubId) -> str:
    """The local-directory half of a miss, worded as the loaders word a missing directory."""
    return f"{key}: {ref} is not a Hugging Face model directory (no config.json)"


def not_found_message(ref: HubId, key: str, cache: Path, offline: bool, exc: Exception) -> str:
    """What is missing (id, revision, cache directory) and how to get it, for a miss in the cache."""
    rev = ref.revision or "main"
    fetch = f"`hf download {ref.repo_id}{' --revision ' + ref.revision if ref.revision else ''}`"
    if offline:
        why = (f"HF_HUB_OFFLINE=1 reads the cache alone: fetch it with {fetch} where the hub is reachable (the same "
               f"HF_HUB_CACHE / HF_HOME), or unset HF_HUB_OFFLINE to download it")
    else:
        why = f"the hub could not be reached ({_first_line(exc)}): fetch it with {fetch} where it is"
    where = "is not in" if type(exc).__name__ != "IncompleteSnapshotError" else "misses files in"
    return (f"{_not_local(key, ref)}, nor a hub model in the cache: {ref.repo_id} at revision {rev} {where} "
            f"{cache}; {why}")


def _first_line(exc: Exception) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def cached_model_path(spec: str | os.PathLike | None, *, allow_patterns: tuple[str, ...] = ALLOW_PATTERNS
                      ) -> Path | None:
    """The local directory of ``spec`` without any network call: itself when local, its snapshot when it is a hub id
    already in the cache (with the files of ``allow_patterns``, where the cache lists the repository's files), else
    None (used where a missing model must not fail: plans, config checks)."""
    if spec is None or not str(spec):
        return None
    ref = hub_id_of(spec)
    if ref is None:
        path = Path(str(spec)).expanduser()
        return path if path.exists() else None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(ref.repo_id, revision=ref.revision, cache_dir=hub_cache_dir(),
                                      allow_patterns=list(allow_patterns), local_files_only=True))
    except Exception:  # noqa: BLE001 - any miss (not cached, incomplete, bad id) is "not here"
        return None


def hub_origin(path: str | os.PathLike) -> HubOrigin | None:
    """``org/name`` and the commit of a snapshot directory of a hub cache (``.../models--org--name/snapshots/
    <commit>``), or None for any other directory."""
    path = Path(path)
    parts = path.parts
    if len(parts) < 3 or parts[-2] != "snapshots" or len(parts[-1]) != 40:
        return None
    folder = parts[-3]
    for prefix in ("models--", "datasets--"):
        if folder.startswith(prefix) and folder.count("--") >= 2:
            org, _, name = folder[len(prefix):].partition("--")
            return HubOrigin(f"{org}/{name}", parts[-1])
    return None


def pin(spec: str | None, *, key: str = "model.path", trust_remote_code: bool = False) -> str | None:
    """``spec`` with a hub id pinned to the commit it resolves to (``org/name@<40-hex commit>``); a local path,
    None, or an id already pinned to a commit comes back as it is. Resolving may download (module docstring)."""
    ref = hub_id_of(spec)
    if ref is None:
        return spec
    origin = hub_origin(resolve_model_path(spec, key=key, trust_remote_code=trust_remote_code))
    return str(HubId(ref.repo_id, origin.commit)) if origin else spec
