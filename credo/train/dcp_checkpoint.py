"""The sharded (FSDP2) model and optimizer state of a checkpoint, with ``torch.distributed.checkpoint`` (DCP).

A ``distributed.strategy=fsdp2`` checkpoint of rank 0 (:mod:`credo.train.checkpoint`) holds, besides the whole
Hugging Face ``model/`` (for eval and export) and each rank's trainer state in its own run directory::

    step_000040/dcp/
        __0_0.distcp, __1_0.distcp, ...   each rank's shards of the trainable weights (not a LoRA policy's frozen
                                          base: it comes with model/) and of the AdamW state, one file a rank
        .metadata                         DCP's index of the shards (written by rank 0, pickled by DCP)
        sharded.json                      credo's note: format and the number of ranks that wrote it

Every rank writes its own shards into rank 0's checkpoint folder before rank 0 writes the manifest, so the
manifest's sha256 covers them all and the atomic rename publishes them together: rank 0's run directory must be
on a filesystem every rank writes (one node, or a shared filesystem across nodes).

Loading reshards: DCP reads, for each rank's shards of the current world size, the byte ranges of the saved
shards they overlap, so an N-rank checkpoint loads on M ranks (docs/distributed.md, "Resuming an FSDP2 run").

Trust boundary. DCP stores its ``.metadata`` with :mod:`pickle` and, by default, unpickles non-tensor entries (the
optimizer's ``param_groups``) with ``torch.load(weights_only=False)``. credo loads only a checkpoint whose files
match the sha256 manifest credo wrote when it saved them (the caller checks,
:func:`credo.train.checkpoint.checkpoint_problem`), and on top of that unpickles ``.metadata`` with an allow-list
of DCP's own metadata classes and the few torch helpers they name (:class:`_MetadataUnpickler`: any other global,
``os.system`` say, is refused before it is called) and the non-tensor entries with ``torch.load(weights_only=True)``;
tensors are read as raw bytes with ``weights_only=True`` by DCP itself. Loading runs no code from the checkpoint.
"""
from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any, Callable

import torch

DCP_DIR = "dcp"
INFO = "sharded.json"
INFO_FORMAT = "credo-dcp/1"

# the globals a DCP .metadata pickle names (torch 2.13's FileSystemWriter): DCP's metadata dataclasses, the
# filesystem writer's storage record, torch.Size / dtypes / layouts and the checkpoint's path
_DCP_METADATA = {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}
_ALLOWED = {("torch.distributed.checkpoint.metadata", n) for n in _DCP_METADATA} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}


class ShardedStateError(ValueError):
    """A sharded checkpoint that cannot be loaded safely (a refused global in its metadata, a missing note)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``: DCP's metadata classes, torch dtypes and the few helpers of the allow-list,
    nothing else (module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise ShardedStateError(f"DCP metadata names {module}.{name}, which a credo checkpoint never holds: refused")


def _reader(folder: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        """DCP's file reader, its metadata unpickled with the allow-list."""

        def read_metadata(self, *args: Any, **kwargs: Any):
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(folder))


def _planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses

    class SafeLoadPlanner(DefaultLoadPlanner):
        """DCP's load planner with the non-tensor entries read by ``torch.load(weights_only=True)``."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeLoadPlanner()


def save_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, world_size: int) -> None:
    """Write this rank's shards of ``model`` and ``optimizer`` into ``folder`` (the same path on every rank): a
    collective, every rank calls it at the same point. When it returns on rank 0 every rank's file is written
    and synced (DCP gathers the ranks' write results before rank 0 writes ``.metadata``)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=_options(strict=True))
    _drop_frozen(model, model_state)
    dcp.save({"model": model_state, "optim": optim_state},
             storage_writer=dcp.FileSystemWriter(str(folder), single_file_per_rank=True, sync_files=True))
    if dist.get_rank() == 0:
        info = {"format": INFO_FORMAT, "world_size": world_size}
        (Path(folder) / INFO).write_text(json.dumps(info, sort_keys=True) + "\n")


def load_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load the shards of ``folder`` into ``model`` and ``optimizer`` (sharded on the current ranks, whatever
    number of ranks wrote it: DCP reshards). A collective. The caller has checked ``folder``'s checkpoint
    against its manifest (module docstring, "Trust boundary")."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    saved_world_size(folder)  # a folder credo wrote (its note parses), or ShardedStateError
    model_state, optim_state = get_state_dict(model, optimizer, options=_options(strict=True))
    _drop_frozen(model, model_state)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, storage_reader=_reader(folder), planner=_planner())  # every trainable tensor, or an error
    # not strict: the frozen parameters are not in the checkpoint (they came with the policy's model/)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_options(strict=False))


def _options(*, strict: bool):
    """Frozen parameters (a LoRA policy's base) are left out: they never change, come with the policy's
    ``model/`` (its base), and would make every checkpoint as large as the base."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _drop_frozen(model: torch.nn.Module, model_state: dict[str, Any]) -> None:
    """Remove the other names of frozen parameters (a tied output head of a frozen embedding), which
    ``ignore_frozen_params`` keeps."""
    for name, param in model.named_parameters(remove_duplicate=False):
        if not param.requires_grad:
            model_state.pop(name, None)


def saved_world_size(folder: Path) -> int:
    """The number of ranks that wrote the sharded state in ``folder`` (its ``sharded.json``)."""
    problem = f"{Path(folder) / INFO} is missing or damaged: not a sharded checkpoint credo wrote"
    try:
        info = json.loads((Path(folder) / INFO).read_text())
        ok = info["format"] == INFO_FORMAT and type(info["world_size"]) is int and info["world_size"] > 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ShardedStateError(problem) from exc
    if not ok:  # a check, not an assert: python -O would skip one
        raise ShardedStateError(problem)
    return info["world_size"]


def sharded_writer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int, world_size: int,
                   group: Any = None) -> Callable[[Path], None]:
    """The ``sharded=`` hook of :func:`credo.train.checkpoint.save_checkpoint` for an FSDP2 run: called on every
    rank with its own partial checkpoint folder, it writes every rank's shards into rank 0's (``.../dcp``)."""
    import torch.distributed as dist

    def write(tmp: Path) -> None:
        box: list[Any] = [str(tmp) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=group)
        save_sharded(Path(box[0]) / DCP_DIR, model, optimizer, world_size)

    return write
