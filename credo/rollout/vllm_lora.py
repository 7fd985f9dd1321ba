"""LoRA adapters on the vLLM rollout engine (``model.lora`` with ``rollout.engine=vllm``; docs/lora.md).

vLLM starts once on the base weights (the run's ``RUN_DIR/base`` or ``model.path``: the policy's
``credo_lora_base``) with ``enable_lora`` (:func:`lora_engine_args`), and every weight sync sends the adapter only:

- the adapter tensors are written as PEFT's adapter directory (``adapter_model.safetensors`` with PEFT's
  ``base_model.model.`` keys, ``adapter_config.json``) into a scratch folder under the run directory, one folder per
  sync (:func:`write_adapter`);
- in process, vLLM loads it as a new adapter (a new ``LoRARequest`` name and ``lora_int_id`` per sync,
  ``LLMEngine.add_lora``), the previous one is removed (``remove_lora``), and every later generation and scoring
  request names the new one (:attr:`credo.rollout.vllm_transport.InProcessVLLM.lora_request`);
- against a server, the same folder goes to vLLM's runtime LoRA routes (``POST /v1/load_lora_adapter``, then
  ``/v1/unload_lora_adapter`` for the previous one; the server runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``,
  which credo sets on a server it starts), and requests name the adapter as their ``model``. A server given by URL
  must read the trainer's scratch folder at the same path (one machine, or a shared filesystem).

Adapter names are ``credo-lora-<sync>-v<version>``: :meth:`VLLMLoRA.served_version` reads the version back from
what vLLM itself lists (the loaded adapter ids in process, ``GET /v1/models`` on a server). A new name per sync
also keeps vLLM's prefix cache apart (its block hashes include the adapter's name and path); the cache is reset
after each sync all the same, as for whole-weight syncs.
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from credo.models.lora import ADAPTER_CONFIG, ADAPTER_NAME, ADAPTER_WEIGHTS, PEFT_PREFIX, is_lora

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted max_lora_rank values (config/lora.py)
NAME_PREFIX = "credo-lora-"
SERVER_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # a server's /v1/load_lora_adapter routes need it


def vllm_lora_rank(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r``."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"model.lora.r={r}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")


def lora_engine_args(peft_config: Any) -> dict[str, Any]:
    """``vllm.LLM`` keywords (server flags) that serve one adapter of ``peft_config``'s rank on the base."""
    return {"enable_lora": True, "max_lora_rank": vllm_lora_rank(int(peft_config.r)), "max_loras": 1}


def adapter_tensors(weights: torch.nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA'd policy (a module, or its state dict) under PEFT's file names
    (``base_model.model.<module>.lora_A.weight``), as ``peft.get_peft_model_state_dict`` + ``save_adapter`` name
    them; contiguous CPU copies. A state without adapter tensors is an error."""
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    marker = f".{ADAPTER_NAME}."
    out = {PEFT_PREFIX + k.replace(marker, "."): v.detach().to("cpu").contiguous()
           for k, v in state.items() if "lora_" in k}
    if not out:
        raise ValueError("the LoRA vLLM engine was given weights without adapter tensors (lora_A / lora_B)")
    return out


def write_adapter(tensors: dict[str, torch.Tensor], config: dict[str, Any], path: Path) -> int:
    """Write PEFT's adapter directory (weights and config) at ``path``; returns the weight file's size in bytes."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=False)
    save_file(tensors, path / ADAPTER_WEIGHTS)
    (path / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    return (path / ADAPTER_WEIGHTS).stat().st_size


def peft_config_json(model: torch.nn.Module) -> dict[str, Any]:
    """The policy's adapter config as ``adapter_config.json`` holds it (inference mode, no base path)."""
    config = copy.deepcopy(model.peft_config[ADAPTER_NAME])
    config.inference_mode = True
    config.base_model_name_or_path = None
    with tempfile.TemporaryDirectory(prefix="credo-lora-config-") as tmp:  # PEFT's own serialisation
        config.save_pretrained(tmp)
        return json.loads((Path(tmp) / ADAPTER_CONFIG).read_text())


class VLLMLoRA:
    """The adapter side of one vLLM engine's transport (module docstring). ``last_sync``: the last sync's
    ``{"bytes": weight file size, "seconds": write + load wall time}``."""

    def __init__(self, transport: Any, config: dict[str, Any], scratch: Path) -> None:
        self.transport = transport
        self.config = config
        self.scratch = scratch
        self.syncs = 0
        self.current: tuple[str, int, Path, int] | None = None  # (name, lora_int_id, folder, version)
        self.server = hasattr(transport, "url")  # ServerVLLM; InProcessVLLM holds an LLM instead
        self.last_sync: dict[str, float] = {}

    def sync(self, weights: torch.nn.Module | dict[str, torch.Tensor], version: int) -> None:
        """Serve the adapter of ``weights`` as policy ``version`` from now on (the base stays as loaded)."""
        t0 = time.perf_counter()
        self.syncs += 1
        name = f"{NAME_PREFIX}{self.syncs}-v{version}"
        folder = self.scratch / name
        size = write_adapter(adapter_tensors(weights), self.config, folder)
        previous = self.current
        if self.server:
            self._load_on_server(name, folder, previous)
        else:
            self._load_in_process(name, folder, previous)
        self.current = (name, self.syncs, folder, version)
        if previous is not None:
            shutil.rmtree(previous[2], ignore_errors=True)
        self.last_sync = {"bytes": float(size), "seconds": time.perf_counter() - t0}

    def _load_in_process(self, name: str, folder: Path, previous: tuple | None) -> None:
        from vllm.lora.request import LoRARequest

        t = self.transport
        t.wake()
        request = LoRARequest(lora_name=name, lora_int_id=self.syncs, lora_path=str(folder))
        engine = t.llm.llm_engine
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the LoRA adapter {folder}")
        t.lora_request = request
        if previous is not None:
            engine.remove_lora(previous[1])
        t.llm.reset_prefix_cache()

    def _load_on_server(self, name: str, folder: Path, previous: tuple | None) -> None:
        t = self.transport
        self._post("v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        t.model_name = name  # completions (and the scorer, which reads the transport's name) ask for the adapter
        if t.scorer is not None:
            t.scorer.model_name = name
        if previous is not None:
            self._post("v1/unload_lora_adapter", {"lora_name": previous[0]})
        t.weights.post("reset_prefix_cache")

    def _post(self, route: str, body: dict[str, Any]) -> None:
        """The LoRA routes answer plain text ("Success: ..."), not JSON: an error status is a one-line
        RuntimeError naming the route and vLLM's message."""
        from credo.http_client import HTTPStatusError, request
        from credo.rollout.vllm_sync import CONTROL_REPLY_BYTES

        try:
            request(f"{self.transport.url}/{route}", method="POST", body=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"}, deadline_s=self.transport.opts.request_timeout_s,
                    max_reply_bytes=CONTROL_REPLY_BYTES)
        except HTTPStatusError as exc:
            detail = " ".join(exc.body[:500].decode(errors="replace").split())
            raise RuntimeError(f"vLLM server {route}: HTTP {exc.status}: {detail} (a server given by URL needs "
                               f"--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; docs/lora.md)") from None

    def served_version(self) -> str | None:
        """The policy version of the adapter vLLM lists as loaded (None before the first sync, or when vLLM no
        longer lists it)."""
        if self.current is None:
            return None
        name, lora_id, _, version = self.current
        if self.server:
            listed = {str(m.get("id")) for m in self.transport._get("v1/models").get("data", [])}
            return str(version) if name in listed else None
        return str(version) if lora_id in self.transport.llm.llm_engine.list_loras() else None


def start_lora_engine(cls: type, model: torch.nn.Module, tokenizer: Any, *, scratch: str | Path | None = None,
                      **kwargs: Any) -> Any:
    """A :class:`~credo.rollout.vllm_engine.VLLMRolloutEngine` (``cls``) for a LoRA'd policy: vLLM on the policy's
    base directory with LoRA enabled, serving the policy's current adapter as version 0; adapters are written under
    ``scratch`` (else the engine's ``log_dir``, the run directory; else the system's temporary directory) in a
    ``credo-vllm-lora-*`` folder deleted with the engine."""
    from credo.rollout.vllm_transport import VLLMOptions

    if not is_lora(model):
        raise ValueError("start_lora_engine: the model carries no credo LoRA adapter")
    base = Path(getattr(model, "credo_lora_base", "") or "")
    if not base.name or not (base / "config.json").is_file():
        raise ValueError(f"the LoRA policy's base directory ({str(base) or 'unset'}) is not a Hugging Face model "
                         "directory: vLLM loads the base from it (credo.recipes.lora_stage saves RUN_DIR/base)")
    config = peft_config_json(model)
    opts = kwargs.pop("options", None) or VLLMOptions()
    opts = replace(opts, args=lora_engine_args(model.peft_config[ADAPTER_NAME]) | dict(opts.args))
    where = scratch if scratch is not None else kwargs.get("log_dir")
    if where is not None:
        Path(where).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="credo-vllm-lora-", dir=where))
    engine = None
    try:
        engine = cls(base, tokenizer, options=opts, **kwargs)
        engine.lora = VLLMLoRA(engine.transport, config, folder)
        engine._cleanup = weakref.finalize(engine, shutil.rmtree, str(folder), ignore_errors=True)
        engine.lora.sync(model, 0)
    except BaseException:
        if engine is not None:
            engine.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return engine
