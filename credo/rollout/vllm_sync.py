"""The trainer side of credo's weight sync into vLLM (the inference side: :mod:`credo.rollout.vllm_receiver`).

A sync is vLLM's own RL weight-transfer protocol: ``start_weight_update``, one ``update_weights`` per chunk,
``finish_weight_update(weight_version)``, driven in process through ``vllm.LLM``'s methods or over HTTP through a
server's routes of the same names (:class:`HTTPWeightSync`). Each chunk is ``{"blob": safetensors}`` (raw bytes in
process, base64 over HTTP) of at most ``chunk_bytes`` of tensors, for the ``credo_safetensors`` backend that
:func:`register` adds to vLLM.

This module does not import vLLM (a trainer that talks to a server on another machine needs none).
"""
from __future__ import annotations

import base64
from typing import Any, Iterator

import torch
from safetensors.torch import save as save_safetensors

from credo.http_client import HTTPStatusError, request_json

BACKEND = "credo_safetensors"
CHUNK_BYTES = 64 << 20
CONTROL_REPLY_BYTES = 1 << 20  # vLLM's RL routes answer a few bytes of status JSON


def register() -> None:
    """``vllm.general_plugins`` entry point: adds the ``credo_safetensors`` backend to vLLM (idempotent)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, "credo.rollout.vllm_receiver",
                                                    "SafetensorsWeightReceiver")
    except ValueError:  # registered already (the plugin loads once per process, but be safe)
        pass


def weight_chunks(state: dict[str, torch.Tensor], *, chunk_bytes: int = CHUNK_BYTES,
                  text: bool = True) -> Iterator[dict[str, str | bytes]]:
    """The state dict as update requests: ``{"blob": safetensors}``, base64 text for JSON (``text=True``, HTTP)
    or raw bytes (in process), each at most ``chunk_bytes`` of tensor data (a larger single tensor goes alone).
    A tensor that shares its storage with one already sent (tied embeddings: ``lm_head.weight`` is
    ``embed_tokens.weight``) is cloned and sent too: vLLM's CPU build keeps its own processed copy of a tied head,
    which stays stale when only the embedding arrives (tests/rollout/test_vllm.py caught it); a view of part of a storage
    is cloned as well (safetensors requires whole storages); a sharded tensor (FSDP2's DTensor) is gathered whole
    first."""
    chunk: dict[str, torch.Tensor] = {}
    size, seen = 0, set()
    for name, tensor in state.items():
        full = getattr(tensor, "full_tensor", None)
        t = (full() if callable(full) else tensor).detach().to("cpu").contiguous()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen or t.untyped_storage().nbytes() != t.nbytes:
            t = t.clone()
        seen.add(key)
        nbytes = t.numel() * t.element_size()
        if chunk and size + nbytes > chunk_bytes:
            yield _blob(chunk, text)
            chunk, size = {}, 0
        chunk[name] = t
        size += nbytes
    if chunk:
        yield _blob(chunk, text)


def _blob(chunk: dict[str, torch.Tensor], text: bool) -> dict[str, str | bytes]:
    data = save_safetensors(chunk)
    return {"blob": base64.b64encode(data).decode("ascii") if text else data}


def sync_in_process(llm: Any, state: dict[str, torch.Tensor], *, version: int, chunk_bytes: int = CHUNK_BYTES) -> None:
    """One versioned sync into a ``vllm.LLM`` built with ``weight_transfer_config={"backend": BACKEND}``."""
    llm.start_weight_update()
    for info in weight_chunks(state, chunk_bytes=chunk_bytes, text=False):
        llm.update_weights({"update_info": info})
    llm.finish_weight_update(weight_version=str(version))


class HTTPWeightSync:
    """The same protocol against a vLLM OpenAI-compatible server started with ``VLLM_SERVER_DEV_MODE=1`` (which
    mounts vLLM's RL routes) and ``--weight-transfer-config '{"backend": "credo_safetensors"}'``. Each request must
    complete, connect to the reply's last byte, within ``timeout_s`` and reply at most ``max_reply_bytes``."""

    def __init__(self, base_url: str, *, timeout_s: float = 300.0, max_reply_bytes: int = CONTROL_REPLY_BYTES) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.max_reply_bytes = timeout_s, max_reply_bytes

    def post(self, route: str, body: dict | None = None) -> dict:
        """The decoded JSON reply (``{}`` for an empty one) of ``POST base_url/route``; an HTTP error status is a
        one-line RuntimeError, an unreachable server an OSError, a reply past the deadline or the cap an OSError
        naming the URL and the limit (:mod:`credo.http_client`)."""
        try:
            reply = request_json(f"{self.base_url}/{route}", body or {}, deadline_s=self.timeout_s,
                                 max_reply_bytes=self.max_reply_bytes)
        except HTTPStatusError as exc:
            detail = " ".join(exc.body[:500].decode(errors="replace").split())
            raise RuntimeError(f"vLLM server {route}: HTTP {exc.status}: {detail}") from None
        return {} if reply is None else reply

    def init(self) -> None:
        self.post("init_weight_transfer_engine", {"init_info": {}})

    def sync(self, state: dict[str, torch.Tensor], *, version: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.post("start_weight_update")
        for info in weight_chunks(state, chunk_bytes=chunk_bytes):
            self.post("update_weights", {"update_info": info})
        self.post("finish_weight_update", {"weight_version": str(version)})
