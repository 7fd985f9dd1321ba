"""The trainer side of credo's weight sync into vLLM (the inference side: :mod:`credo.rollout.vllm_receiver`;
docs/distributed.md, "Weight sync into vLLM", for the choice between the backends: ``rollout.vllm.weight_sync``).

:func:`make_weight_sync` builds the sender for a ``rollout.vllm.weight_sync`` choice over a client (vLLM's
``VLLMWeightSyncClient`` methods: :class:`LLMClient` in process, :class:`HTTPWeightSync` over HTTP):
``safetensors`` (:class:`SafetensorsSync`, below), ``torchdist`` (:mod:`credo.rollout.torchdist_sync`: a gloo
group, metadata in the request and the tensors by broadcast in buckets), ``nccl`` / ``ipc`` (vLLM's own engines,
:class:`VLLMEngineSync`; CUDA only, never run here) and ``auto`` (torchdist, falling back to safetensors when the
engine rejects it, e.g. a server started with the ``credo_safetensors`` backend).

The safetensors sync is vLLM's own RL weight-transfer protocol: ``start_weight_update``, one ``update_weights`` per chunk,
``finish_weight_update(weight_version)``, driven in process through ``vllm.LLM``'s methods or over HTTP through a
server's routes of the same names (:class:`HTTPWeightSync`). Each chunk is ``{"blob": safetensors}`` (raw bytes in
process, base64 over HTTP) of at most ``chunk_bytes`` of tensors, for the ``credo_safetensors`` backend that
:func:`register` adds to vLLM.

This module does not import vLLM (a trainer that talks to a server on another machine needs none).
"""
from __future__ import annotations

import base64
import logging
from typing import Any, Iterator

import torch
from safetensors.torch import save as save_safetensors

from credo.http_client import HTTPStatusError, request_json

log = logging.getLogger(__name__)

BACKEND = "credo_safetensors"
TORCHDIST_BACKEND = "credo_torchdist"
WEIGHT_SYNCS = ("auto", "safetensors", "torchdist", "nccl", "ipc")
ENGINE_BACKENDS = {"auto": TORCHDIST_BACKEND, "safetensors": BACKEND, "torchdist": TORCHDIST_BACKEND,
                   "nccl": "nccl", "ipc": "ipc"}
CHUNK_BYTES = 64 << 20
CONTROL_REPLY_BYTES = 1 << 20  # vLLM's RL routes answer a few bytes of status JSON


def register() -> None:
    """``vllm.general_plugins`` entry point: adds the ``credo_safetensors`` and ``credo_torchdist`` backends to
    vLLM (idempotent)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    for name, module, cls in ((BACKEND, "credo.rollout.vllm_receiver", "SafetensorsWeightReceiver"),
                              (TORCHDIST_BACKEND, "credo.rollout.vllm_torchdist_receiver", "TorchDistWeightReceiver")):
        try:
            WeightTransferEngineFactory.register_engine(name, module, cls)
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
    SafetensorsSync(LLMClient(llm), chunk_bytes=chunk_bytes).sync(state, version=version)


class LLMClient:
    """vLLM's ``VLLMWeightSyncClient`` over a ``vllm.LLM`` in this process (chunks go as raw bytes)."""

    text_chunks = False

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version=weight_version)

    def served_version(self) -> str | None:
        return self.llm.get_weight_version()


class HTTPWeightSync:
    """vLLM's ``VLLMWeightSyncClient`` against a vLLM OpenAI-compatible server started with
    ``VLLM_SERVER_DEV_MODE=1`` (which mounts vLLM's RL routes) and ``--weight-transfer-config '{"backend":
    "credo_torchdist"}'`` (or ``credo_safetensors``); :meth:`init` and :meth:`sync` are the safetensors sync.
    Each request must complete, connect to the reply's last byte, within ``timeout_s`` and reply at most
    ``max_reply_bytes``."""

    text_chunks = True  # base64 inside the JSON body

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

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.post("init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.post("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self.post("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.post("finish_weight_update", {"weight_version": weight_version})

    def served_version(self) -> str | None:
        return request_json(f"{self.base_url}/weight_info", deadline_s=self.timeout_s,
                            max_reply_bytes=CONTROL_REPLY_BYTES).get("weight_version")

    def init(self) -> None:
        self.init_weight_transfer_engine({})

    def sync(self, state: dict[str, torch.Tensor], *, version: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        SafetensorsSync(self, chunk_bytes=chunk_bytes).sync(state, version=version)


class SafetensorsSync:
    """The ``credo_safetensors`` sync over a client: start, one ``{"blob": ...}`` request per chunk, finish."""

    def __init__(self, client: Any, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.client, self.chunk_bytes = client, chunk_bytes

    def init(self) -> None:
        self.client.init_weight_transfer_engine({})

    def sync(self, state: dict[str, torch.Tensor], *, version: int | str) -> None:
        self.client.start_weight_update()
        for info in weight_chunks(state, chunk_bytes=self.chunk_bytes, text=self.client.text_chunks):
            self.client.update_weights(info)
        self.client.finish_weight_update(weight_version=str(version))

    def close(self) -> None:
        pass


class _StateSource:
    """vLLM's ``WeightSource`` over the state dict of the sync in progress (duck-typed: no vLLM import here)."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}

    def metadata(self) -> list:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.state.items()]

    def __iter__(self):
        for name, t in self.state.items():
            full = getattr(t, "full_tensor", None)
            yield name, (full() if callable(full) else t).detach().contiguous()

    def held_names(self):
        return None

    def groups(self) -> list[list[str]]:
        from vllm.distributed.weight_transfer.base import layerwise_groups

        return layerwise_groups(list(self.state))


class _Versioned:
    """A client whose ``finish_weight_update`` sets the version of the sync in progress (vLLM's trainer engines
    call it without one)."""

    def __init__(self, client: Any) -> None:
        self.client, self.version = client, None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.client.finish_weight_update(weight_version=weight_version or self.version)


class VLLMEngineSync:
    """vLLM's own trainer-side engines, ``nccl`` (a NCCL group between this process's GPU and the workers',
    packed buckets of ``bucket_bytes``) or ``ipc`` (CUDA IPC handles to a colocated engine on the same GPU),
    through ``WeightTransferTrainerFactory``. NEVER RUN: written to vLLM's documented API, but no GPU was lent
    while it was built (docs/distributed.md, "Weight sync into vLLM"); the engine must be started with the same backend."""

    def __init__(self, kind: str, client: Any, *, workers: int = 1, host: str = "127.0.0.1",
                 bucket_bytes: int = 32 << 20) -> None:
        if kind not in ("nccl", "ipc"):
            raise ValueError(f"VLLMEngineSync: kind must be nccl or ipc, got {kind!r}")
        if not torch.cuda.is_available():
            raise ValueError(f"rollout.vllm.weight_sync={kind} needs CUDA (vLLM's {kind} engine moves GPU tensors); "
                             "on the CPU use torchdist")
        self.kind, self.client, self.workers, self.host, self.bucket_bytes = kind, _Versioned(client), workers, host, \
            bucket_bytes
        self.source = _StateSource()
        self.engine: Any = None

    def init(self) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        if self.kind == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            from credo.rollout.torchdist_sync import free_port

            info: Any = NCCLTrainerInitInfo(master_address=self.host, master_port=free_port(self.host),
                                            world_size=1 + self.workers, rank=0, packed=True,
                                            packed_buffer_size_bytes=self.bucket_bytes)
        else:
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(rank=0, packed=True, packed_buffer_size_bytes=self.bucket_bytes)
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=self.client, source=self.source)

    def sync(self, state: dict[str, torch.Tensor], *, version: int | str) -> None:
        device = torch.device("cuda", torch.cuda.current_device())
        self.source.state = {n: t.detach().to(device) for n, t in state.items()}
        self.client.version = str(version)
        try:
            self.engine.send_weights()
        finally:
            self.source.state = {}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


def workers_of(args: dict) -> int:
    """vLLM's worker count for engine arguments ``args`` (tensor x pipeline x data parallel sizes)."""
    n = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        n *= int(args.get(key, args.get(key.replace("_", "-"), 1)) or 1)
    return n


def make_weight_sync(kind: str, client: Any, *, workers: int = 1, bucket_bytes: int = 32 << 20,
                     timeout_s: float = 60.0, host: str = "127.0.0.1", only_changed: bool = True) -> Any:
    """The sender for ``rollout.vllm.weight_sync`` ``kind`` over ``client``, initialized (its ``init`` ran: the
    engine's workers joined where the kind has a group): an object with ``sync(state, version=)`` and
    ``close()``. ``auto`` is torchdist, or safetensors (with a warning) when the engine rejects torchdist's init."""
    from credo.rollout.torchdist_sync import TorchDistWeightSync

    if kind not in WEIGHT_SYNCS:
        raise ValueError(f"rollout.vllm.weight_sync must be one of {WEIGHT_SYNCS}, got {kind!r}")
    if kind == "safetensors":
        sender: Any = SafetensorsSync(client)
    elif kind in ("nccl", "ipc"):
        sender = VLLMEngineSync(kind, client, workers=workers, host=host, bucket_bytes=bucket_bytes)
    else:
        sender = TorchDistWeightSync(client, workers=workers, host=host, bucket_bytes=bucket_bytes,
                                     timeout_s=timeout_s, only_changed=only_changed)
    try:
        sender.init()
    except RuntimeError as exc:
        if kind != "auto":
            raise
        # the message, not the exception: a kept log record must not hold its traceback's frames (and through
        # them the engine being built, whose finalizer removes its temporary model folder)
        log.warning("rollout.vllm.weight_sync=auto: torchdist could not start (%s); syncing as safetensors", str(exc))
        sender = SafetensorsSync(client)
        sender.init()
    return sender
