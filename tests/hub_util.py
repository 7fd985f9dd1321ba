"""A Hugging Face hub cache on disk, written the way ``huggingface_hub`` lays it out (``HF_HUB_CACHE``):

    <cache>/models--org--name/blobs/<sha256>                 the files' contents
    <cache>/models--org--name/refs/main                      the commit the branch points at
    <cache>/models--org--name/snapshots/<commit>/<path>      a relative link to ../../blobs/<sha256>

(``datasets--org--name`` for a dataset repository). Tests check that ``huggingface_hub`` itself reads it
(``scan_cache_dir``, ``snapshot_download(local_files_only=True)``), so credo is tested on the layout a real
download leaves."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def add_snapshot(cache: Path, repo_id: str, files: dict[str, bytes | Path], *, repo_type: str = "model",
                 ref: str | None = "main", tag: str = "") -> str:
    """Write ``files`` (repository path -> bytes, or a local file to copy) as one commit of ``repo_id`` into the hub
    cache ``cache``; ``ref`` (a branch or tag name, None = none) is pointed at it. Returns the 40-hex commit."""
    from huggingface_hub.file_download import repo_folder_name

    repo = Path(cache) / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
    data = {name: (src.read_bytes() if isinstance(src, Path) else src) for name, src in files.items()}
    commit = hashlib.sha1(repr((repo_id, tag, sorted((k, hashlib.sha256(v).hexdigest()) for k, v in
                                                       data.items()))).encode()).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, content in data.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return commit


def add_model_dir(cache: Path, repo_id: str, model_dir: Path, **kw) -> str:
    """Every file of a saved model directory (``save_model``) as one commit of ``repo_id``."""
    files = {str(p.relative_to(model_dir)): p for p in sorted(Path(model_dir).rglob("*")) if p.is_file()}
    return add_snapshot(cache, repo_id, files, **kw)
