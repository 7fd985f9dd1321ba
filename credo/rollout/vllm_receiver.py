"""The inference side of credo's weight sync into vLLM: a vLLM weight-transfer backend (``credo_safetensors``).

Imported only inside vLLM's processes (vLLM loads it through the ``vllm.general_plugins`` entry point that
``pyproject.toml`` declares, :func:`credo.rollout.vllm_sync.register`). vLLM's built-in backends (``nccl``,
``ipc``, ...) move tensors over NCCL or CUDA IPC and so need a GPU; this one carries each chunk as a
safetensors blob inside the update request itself (raw bytes in process, base64 over HTTP), so the same path
works on vLLM's CPU build, on CUDA, in process (``LLM.update_weights``) and over HTTP (a server's
``/update_weights``). Safetensors holds tensors only:
a request cannot make the server run code.

Each update is vLLM's layer-wise reload (``initialize_layerwise_reload`` at start, the model's own
``load_weights`` per chunk, ``finalize_layerwise_reload`` at finish), so the weights arrive in checkpoint format
and vLLM repacks them for its kernels (on CPU it repacks linear layers after loading and empties
``layer.weight``, which is why a plain ``load_weights`` after start-up does not work there).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

from safetensors.torch import load as load_safetensors
from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)


@dataclass
class SafetensorsInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the weights ride the update requests."""


@dataclass
class SafetensorsUpdateInfo(WeightTransferUpdateInfo):
    blob: str | bytes  # one safetensors file (a chunk of the state dict, names as in the HF checkpoint): raw bytes
    # in process, base64 text over HTTP


class SafetensorsWeightReceiver(WeightTransferEngine[SafetensorsInitInfo, SafetensorsUpdateInfo]):
    init_info_cls = SafetensorsInitInfo
    update_info_cls = SafetensorsUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: SafetensorsInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: SafetensorsUpdateInfo) -> None:
        blob = update_info.blob
        tensors = load_safetensors(base64.b64decode(blob) if isinstance(blob, str) else blob)
        self.model.load_weights(iter(tensors.items()))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        pass
