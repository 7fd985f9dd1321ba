"""The inference side of the ``credo_torchdist`` weight-transfer backend (the trainer side:
:class:`credo.rollout.torchdist_sync.TorchDistWeightSync`; docs/distributed.md, "Weight sync into vLLM").

Imported only inside vLLM's worker processes (registered by :func:`credo.rollout.vllm_sync.register`). On
``init_weight_transfer_engine`` each worker joins the trainer's gloo group (rank ``rank_offset`` + its global
rank, vLLM's own numbering for its ``nccl`` engine) through the trainer's ``TCPStore``; an ``update_weights``
request carries only the buckets' metadata, and the worker receives each bucket's flat buffer by broadcast from
rank 0 (the next bucket is received while the current one loads). A request with a ``blob`` is the
``credo_safetensors`` path, so an engine started with this backend also takes safetensors syncs (the fallback).

Loading is vLLM's layer-wise reload as for safetensors (:mod:`credo.rollout.vllm_receiver`): a layer the trainer
did not resend (nothing in it changed) keeps its weights; vLLM then logs "Failed to load weights" for it, which
this receiver filters out of that one finalize.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from vllm.distributed.weight_transfer.base import WeightTransferInitInfo, WeightTransferUpdateInfo

from credo.rollout.torchdist_sync import broadcast, check_bucket, first_line, open_group, unpack
from credo.rollout.vllm_receiver import SafetensorsWeightReceiver

log = logging.getLogger(__name__)


@dataclass
class TorchDistInitInfo(WeightTransferInitInfo):
    """Where the trainer's rendezvous is (all None: no group, safetensors syncs only)."""

    master_address: str | None = None
    master_port: int | None = None
    world_size: int = 2
    rank_offset: int = 1
    timeout_s: float = 60.0


@dataclass
class TorchDistUpdateInfo(WeightTransferUpdateInfo):
    buckets: list[dict] | None = None  # torchdist: per bucket names, dtypes, shapes, offsets, nbytes
    blob: str | bytes | None = None  # safetensors (the fallback)


class _QuietSkippedLayers(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to load weights" not in record.getMessage()


class TorchDistWeightReceiver(SafetensorsWeightReceiver):
    init_info_cls = TorchDistInitInfo  # type: ignore[assignment]
    update_info_cls = TorchDistUpdateInfo  # type: ignore[assignment]
    supports_draft_weight_update = False

    group = None
    partial = False

    def init_transfer_engine(self, init_info: TorchDistInitInfo) -> None:  # type: ignore[override]
        self.shutdown()
        if init_info.master_address is None or init_info.master_port is None:
            return
        pc = self.parallel_config
        rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
        try:
            self.group = open_group(init_info.master_address, int(init_info.master_port), rank=rank,
                                    world_size=int(init_info.world_size), timeout_s=float(init_info.timeout_s))
        except Exception as exc:  # noqa: BLE001 - one line back to the trainer
            raise RuntimeError(f"credo_torchdist: worker rank {rank} could not join the trainer's group at "
                               f"{init_info.master_address}:{init_info.master_port} within {init_info.timeout_s:g} s "
                               f"({first_line(exc)})") from None

    def start_weight_update(self) -> None:
        self.partial = False
        super().start_weight_update()

    def receive_weights(self, update_info: TorchDistUpdateInfo) -> None:  # type: ignore[override]
        if update_info.blob is not None:
            super().receive_weights(update_info)  # type: ignore[arg-type]
            return
        if self.group is None:
            raise RuntimeError("credo_torchdist: a bucketed update before init_weight_transfer_engine joined a group")
        buckets = update_info.buckets or []
        for meta in buckets:
            check_bucket(meta)
        self.partial = True  # the trainer may have left out unchanged layers
        # a fresh buffer per bucket: the layer-wise reload keeps views of a layer's weights until the layer is
        # complete, which may be a bucket later
        bufs = [torch.empty(m["nbytes"], dtype=torch.uint8) for m in buckets[:1]]
        work = broadcast(self.group, bufs[0]) if bufs else None
        for i, meta in enumerate(buckets):
            work.wait()
            buf = bufs[i]
            if i + 1 < len(buckets):
                bufs.append(torch.empty(buckets[i + 1]["nbytes"], dtype=torch.uint8))
                work = broadcast(self.group, bufs[i + 1])
            self.model.load_weights(iter(unpack(buf, meta)))
            bufs[i] = None  # type: ignore[call-overload]  # the reload holds what it still needs

    def finish_weight_update(self) -> None:
        quiet = _QuietSkippedLayers() if self.partial else None
        target = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        if quiet is not None:
            target.addFilter(quiet)
        try:
            super().finish_weight_update()
        finally:
            if quiet is not None:
                target.removeFilter(quiet)

    def shutdown(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            try:
                group.shutdown()
            except Exception:  # noqa: BLE001 - best effort
                pass
