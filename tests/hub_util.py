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
                 ref: str | None = "main", tag: str = "", missing: tuple[str, ...] = ()) -> str:
    """Write ``files`` (repository path -> bytes, or a local file to copy) as one commit of ``repo_id`` into the hub
    cache ``cache``; ``ref`` (a branch or tag name, None = none) is pointed at it. The commit's file listing is cached
    as huggingface_hub 2.x's downloads cache it (``trees/<commit>.json``, written by its own ``write_tree_cache``);
    ``missing`` names files listed there but absent (an interrupted download). Returns the 40-hex commit."""
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
    try:
        from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache
    except ImportError:  # a huggingface_hub without tree listings: snapshots are taken as complete
        return commit
    listing = {name: TreeCacheEntry(size=len(content), blob_id=hashlib.sha1(content).hexdigest())
               for name, content in data.items()}
    listing.update({name: TreeCacheEntry(size=1, blob_id="0" * 40) for name in missing})
    write_tree_cache(str(repo), commit, listing)
    return commit


def add_model_dir(cache: Path, repo_id: str, model_dir: Path, **kw) -> str:
    """Every file of a saved model directory (``save_model``) as one commit of ``repo_id``."""
    files = {str(p.relative_to(model_dir)): p for p in sorted(Path(model_dir).rglob("*")) if p.is_file()}
    return add_snapshot(cache, repo_id, files, **kw)


def parquet_bytes(rows: list[dict]) -> bytes:
    """``rows`` as one Parquet file's bytes."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def dataset_card(subset: str, splits: list[str], num_bytes: dict[str, int] | None = None) -> bytes:
    """A dataset card whose ``configs`` name ``subset`` and its splits' Parquet files (``SUBSET/SPLIT-*``), as the
    hub's Parquet datasets (openai/gsm8k) have: what ``datasets`` reads to find a subset in a snapshot; with
    ``num_bytes``, its ``dataset_info`` states those split sizes."""
    files = "".join(f"  - split: {s}\n    path: {subset}/{s}-*\n" for s in splits)
    info = ""
    if num_bytes:
        info = f"dataset_info:\n  config_name: {subset}\n  splits:\n" + "".join(
            f"  - name: {s}\n    num_bytes: {n}\n    num_examples: 1\n" for s, n in num_bytes.items())
    return f"---\n{info}configs:\n- config_name: {subset}\n  data_files:\n{files}---\n# test dataset\n".encode()


def add_dataset(cache: Path, repo_id: str, splits: dict[str, list[dict]], *, subset: str = "main",
                num_bytes: dict[str, int] | None = None, **kw) -> str:
    """A Parquet dataset repository (card + ``SUBSET/SPLIT-00000-of-00001.parquet``) as one commit."""
    files: dict[str, bytes | Path] = {"README.md": dataset_card(subset, list(splits), num_bytes)}
    files.update({f"{subset}/{s}-00000-of-00001.parquet": parquet_bytes(rows) for s, rows in splits.items()})
    return add_snapshot(cache, repo_id, files, repo_type="dataset", **kw)


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def save_tiny_model(out: Path, *, seed: int = 0, max_position_embeddings: int = 64, chat: bool = False) -> Path:
    """A tiny Qwen2 policy (tests/conftest.py's sizes) saved as a Hugging Face directory; ``chat``: its tokenizer
    gets a small chat template (as an instruct model's)."""
    from credo.config import ModelConfig
    from credo.models import build_model, save_model

    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      max_position_embeddings=max_position_embeddings)
    model, tok = build_model(cfg, seed=seed)
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    save_model(model, tok, out)
    return out
