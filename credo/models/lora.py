"""LoRA RL with PEFT: adapters injected into the policy in place, trained, checkpointed and synced alone.

``model.lora: {r, alpha, dropout, target_modules}`` puts PEFT LoRA layers (``peft.inject_adapter_in_model``) on
the policy's linear modules. The policy stays the Hugging Face class it was (a ``Qwen2ForCausalLM`` is still
one, not a ``PeftModel`` wrapper), so every forward path of credo runs through the adapters unchanged: the
naive logits, the chunked log-probs and packing (``model.base_model`` is the backbone whose projections are now
LoRA layers), the shared-prompt forward, and the lean decoder (credo.rollout.lean calls the same submodules).
Only the adapter tensors have ``requires_grad``; the optimizer takes exactly those.

- the reference policy of a KL term is the policy with its adapters disabled (:func:`adapters_disabled`): no
  second copy, nothing saved to ``RUN_DIR/reference``;
- the base is the policy as RL starts: after the SFT warm start it is saved once per run directory
  (``RUN_DIR/base``); a ``model.path`` run without a warm start uses that directory;
- a checkpoint's ``model/`` holds PEFT's ``adapter_model.safetensors`` + ``adapter_config.json`` (loadable by
  ``peft.PeftModel.from_pretrained``), the tokenizer, and :data:`BASE_FILE` naming the base (relative path first,
  so a moved run directory still resolves; the base's ``config.json`` sha256 and weight sizes are checked);
- the rollout engine's copy of the policy receives only adapter tensors (:func:`adapter_state`);
- ``credo export`` merges the adapter into the base (credo.models.build.merged_adapter_model).

The recipe's side (config checks, the warm start before the adapters, the base's directory) is
credo.recipes.lora_stage; loading an adapter directory with its base is credo.models.build.load_model.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

import torch

from credo.models.hub import hub_origin, resolve_model_path

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_FILE = "credo_base.json"
BASE_DIR = "base"  # RUN_DIR/base: the run's base model (after the warm start)
PEFT_PREFIX = "base_model.model."  # PEFT's on-disk key prefix (a PeftModel's names)
ADAPTER_NAME = "default"
UNSUPPORTED_TARGETS = ("lm_head", "embed_tokens")


# ----------------------------------------------------------------------------- adapters on a module

def peft_config(lora, *, inference: bool = False):
    """PEFT's ``LoraConfig`` of a :class:`credo.config.schema.LoraConfig` section."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM",
                          inference_mode=inference)


def apply_lora(model: torch.nn.Module, lora, *, seed: int = 0) -> torch.nn.Module:
    """Inject LoRA adapters into ``model`` in place (A: PEFT's Kaiming-uniform init drawn from ``seed``, B: zeros,
    so the policy starts equal to the base); freezes every other parameter. Returns ``model``."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    cfg = lora if isinstance(lora, PeftLoraConfig) else peft_config(lora)  # a saved adapter's, or the run's
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            inject_adapter_in_model(cfg, model, adapter_name=ADAPTER_NAME)
        except ValueError as exc:  # no module matched target_modules
            raise ValueError(f"model.lora.target_modules: {' '.join(str(exc).split())[:300]}") from exc
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def is_lora(model) -> bool:
    """Whether ``model`` carries credo's (PEFT) adapters."""
    return isinstance(model, torch.nn.Module) and isinstance(getattr(model, "peft_config", None), dict) \
        and ADAPTER_NAME in model.peft_config


def _tuner_layers(model: torch.nn.Module):
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside: ``model`` computes as its base (every LoRA layer bypassed); restored on exit, also on errors."""
    layers = _tuner_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)  # also gives the adapter back its requires_grad (disabling cleared it)


def merged_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` with every LoRA layer merged into its base weight (W <- W + (alpha / r) B A) and
    replaced by that plain base layer, all parameters trainable: a LoRA policy's backbone for a new critic
    (credo.models.value.ValueModel.from_policy), which then saves and loads as any Hugging Face backbone."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out = copy.deepcopy(module)
    for name, layer in [(n, m) for n, m in out.named_modules() if isinstance(m, BaseTunerLayer)]:
        layer.merge()
        parent, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, child, layer.get_base_layer())
    for attr in ("peft_config", "_hf_peft_config_loaded", "credo_lora_base"):
        if attr in out.__dict__:
            delattr(out, attr)
    return out.requires_grad_(True)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA'd module by their module names (``...q_proj.lora_A.default.weight``)."""
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


@torch.no_grad()
def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (:func:`adapter_state` of a module of the same shape) into ``model``'s adapters; the names must
    match exactly (a missing or extra adapter is an error, never silently skipped)."""
    own = adapter_state(model)
    if own.keys() != state.keys():
        missing, extra = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
        raise ValueError(f"adapter state does not match the model's adapters (missing {missing[:2]}, "
                         f"unexpected {extra[:2]})")
    for k, v in state.items():
        own[k].copy_(v)


# ----------------------------------------------------------------------------- saving and loading

def base_identity(base: Path) -> dict:
    """What identifies a base directory: its ``config.json``'s sha256 and the sizes of its weight files."""
    weights = {p.name: p.stat().st_size for p in sorted(base.glob("*.safetensors"))}
    config = hashlib.sha256((base / "config.json").read_bytes()).hexdigest()
    return {"config_sha256": config, "weights": weights}


def save_adapter(model: torch.nn.Module, tokenizer, path: str | Path) -> None:
    """Write PEFT's adapter directory (``adapter_model.safetensors`` in PEFT's key format, ``adapter_config.json``),
    the tokenizer, and :data:`BASE_FILE` naming the base model. Under torch.distributed only rank 0 writes the
    adapter (as transformers' ``save_pretrained`` writes weights on rank 0 only; rank r > 0 saves its tokenizer)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() > 0:
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        return
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME)  # names without ".default"
    save_file({PEFT_PREFIX + k: v.detach().contiguous().cpu() for k, v in state.items()}, path / ADAPTER_WEIGHTS)
    config = model.peft_config[ADAPTER_NAME]
    base = Path(getattr(model, "credo_lora_base", "") or "")
    config.base_model_name_or_path = str(base) if base.name else None
    config.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    if base.name:
        record = {"path": str(base), "relative": os.path.relpath(base, path.resolve()), **base_identity(base)}
        origin = hub_origin(base)
        if origin is not None:  # a snapshot of the hub cache: org/name@commit finds it again elsewhere
            record["hub"] = str(origin)
        (path / BASE_FILE).write_text(json.dumps(record, indent=1) + "\n")


def resolve_base(path: Path) -> Path:
    """The base directory an adapter directory names (relative path first), checked against its identity."""
    record_file = Path(path) / BASE_FILE
    if not record_file.is_file():
        raise FileNotFoundError(f"{path} is a LoRA adapter without {BASE_FILE}: its base model is unknown")
    record = json.loads(record_file.read_text())
    cands = [Path(path) / record["relative"], Path(record["path"])]
    if record.get("hub") and not any((c / "config.json").is_file() for c in cands):
        cands.append(resolve_model_path(record["hub"], key=f"{path}: its base model"))  # credo.models.hub
    for cand in cands:
        if (cand / "config.json").is_file():
            ident = base_identity(cand)
            if ident["config_sha256"] != record["config_sha256"] or ident["weights"] != record["weights"]:
                raise ValueError(f"{cand} is not the base model {path} was trained on (config or weights differ)")
            return cand.resolve()
    raise FileNotFoundError(f"{path}: its base model is missing (looked for {record['relative']} and "
                            f"{record['path']}{' and ' + record['hub'] if record.get('hub') else ''})")


def attach_adapter(model: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """Inject the adapter of directory ``path`` (:func:`save_adapter`) into ``model`` (its base) with its saved
    weights; every adapter tensor must be in the file. Returns ``model``."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(path)
    config = PeftLoraConfig.from_pretrained(path)
    config.inference_mode = False
    apply_lora(model, config)
    state = {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(path / ADAPTER_WEIGHTS).items()}
    result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER_NAME)
    unexpected = list(getattr(result, "unexpected_keys", []))
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if unexpected or missing:
        raise ValueError(f"{path / ADAPTER_WEIGHTS} does not fit its base (missing {missing[:2]}, unexpected "
                         f"{unexpected[:2]})")
    return model


def is_adapter_dir(path: str | Path) -> bool:
    """A PEFT adapter directory (no full model's config.json)."""
    return (Path(path) / ADAPTER_CONFIG).is_file() and not (Path(path) / "config.json").is_file()
