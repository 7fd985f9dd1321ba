"""``credo plan --config X (--gpus N --gpu-mem-gb M | --cpu --mem-gb M) [key=value ...]``: the predicted per-rank
memory under DDP and FSDP2 and the FLOPs of one RL step (:mod:`credo.plan.model`), without building the model:
a built model's sizes come from ``model.*``, a ``model.path``'s from its ``config.json`` (no weights are read)."""
from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

from credo.config.hub_ref import parse_hub_id
from credo.recipes.cli_common import config_args
from credo.plan.model import (DTYPE_BYTES, GIB, Hardware, ModelShape, Workload, lora_params, memory_per_rank,
                              param_count, step_flops)

DEFAULT_PROMPT_TOKENS = 64


def add_commands(sub) -> None:
    p = sub.add_parser("plan", help="predicted per-rank memory (DDP and FSDP2) and FLOPs per RL step of a config "
                       "on a hardware description (docs/plan.md)")
    config_args(p)
    p.add_argument("--gpus", type=int, default=None, metavar="N", help="GPUs (one rank each)")
    p.add_argument("--gpu-mem-gb", type=float, default=None, metavar="M", help="memory of each GPU in GiB")
    p.add_argument("--cpu", action="store_true", help="plan for CPU ranks instead")
    p.add_argument("--mem-gb", type=float, default=None, metavar="M", help="--cpu: memory per rank in GiB")
    p.add_argument("--ranks", type=int, default=1, metavar="N", help="--cpu: processes (ranks), default 1")
    p.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS, metavar="P",
                   help=f"prompt length in tokens (the config does not fix it; default {DEFAULT_PROMPT_TOKENS})")
    p.set_defaults(func=cmd_plan)


def hardware_of(args: argparse.Namespace) -> Hardware:
    """The hardware flags as a :class:`Hardware`; a missing or contradictory flag is a ``ValueError``."""
    if args.cpu:
        if args.gpus is not None or args.gpu_mem_gb is not None:
            raise ValueError("--cpu takes --mem-gb (and --ranks), not --gpus / --gpu-mem-gb")
        if args.mem_gb is None or args.mem_gb <= 0 or args.ranks < 1:
            raise ValueError("--cpu needs --mem-gb M > 0 (and --ranks N >= 1)")
        return Hardware("cpu", args.ranks, args.mem_gb)
    if args.gpus is None or args.gpu_mem_gb is None:
        raise ValueError("give --gpus N --gpu-mem-gb M, or --cpu --mem-gb M")
    if args.gpus < 1 or args.gpu_mem_gb <= 0 or args.mem_gb is not None:
        raise ValueError("--gpus must be >= 1 and --gpu-mem-gb > 0 (--mem-gb is for --cpu)")
    return Hardware("gpu", args.gpus, args.gpu_mem_gb)


def char_vocab_size() -> int:
    """The built-in character tokenizer's size (credo.models.tokenizer, recomputed here so that planning does not
    import transformers): 4 special tokens + printable ASCII without \\r, \\x0b, \\x0c."""
    return 4 + len(dict.fromkeys(string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")))


def shape_of(model_cfg) -> ModelShape:
    """A built model's shape from ``model.*``, or a ``model.path``'s from its config.json."""
    if model_cfg.path is None:
        if model_cfg.arch == "llava":
            raise NotImplementedError("the vision tower of model.arch=llava is not modelled")
        return ModelShape(vocab=char_vocab_size(), hidden=model_cfg.hidden_size,
                          intermediate=model_cfg.intermediate_size, layers=model_cfg.num_layers,
                          heads=model_cfg.num_heads, kv_heads=model_cfg.num_kv_heads, tied=True,
                          qkv_bias=model_cfg.arch == "qwen2")
    path = Path(model_cfg.path).expanduser() / "config.json"
    if not path.parent.exists() and parse_hub_id(model_cfg.path) is not None:  # a hub id: its cached config.json
        from credo.models.hub import cached_model_path, hub_cache_dir

        snap = cached_model_path(model_cfg.path, allow_patterns=("config.json",))
        if snap is None:
            raise FileNotFoundError(f"model.path={model_cfg.path}: credo plan reads the hub model's config.json from "
                                    f"the hub cache {hub_cache_dir()}, where it is not; fetch it with `hf download "
                                    f"{parse_hub_id(model_cfg.path).repo_id} config.json`")
        path = snap / "config.json"
    c = json.loads(path.read_text())
    c = c.get("text_config", c)
    if c.get("model_type") not in ("qwen2", "llama"):
        raise NotImplementedError(f"{path}: model_type {c.get('model_type')!r} is not modelled "
                                  "(Qwen2 and Llama are)")
    heads = c["num_attention_heads"]
    if c.get("head_dim") not in (None, c["hidden_size"] // heads):
        raise NotImplementedError(f"{path}: head_dim != hidden_size / heads is not modelled")
    return ModelShape(vocab=c["vocab_size"], hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                      layers=c["num_hidden_layers"], heads=heads, kv_heads=c.get("num_key_value_heads", heads),
                      tied=bool(c.get("tie_word_embeddings", False)),
                      qkv_bias=c["model_type"] == "qwen2" or bool(c.get("attention_bias", False)))


def workload_of(cfg, ranks: int, prompt_tokens: int) -> Workload:
    """One rank's share of a step: micro-batch = train.micro_batch_size, else micro_batch_tokens / sequence
    length, else the rank's mini-batch; generation batch = min(rollout.max_batch_size, the rank's sequences)
    (``distributed.rollout=replicate``: all sequences). The old-log-prob pass runs when train.old_logprob_pass is
    always, or the batch gets more than one optimizer step, or a reference / critic / one-step-off needs it (an
    approximation of credo.train.plan.StepPlan.fused: what the transforms, terms, estimator and collector declare is
    not read)."""
    t, r = cfg.train, cfg.rollout
    sequences = t.prompts_per_step * r.group_size
    per_rank = -(-sequences // ranks)
    seq = prompt_tokens + r.max_new_tokens
    mini = -(-(t.mini_batch_size or sequences) // ranks)
    micro = t.micro_batch_size or (max(1, t.micro_batch_tokens // seq) if t.micro_batch_tokens else mini)
    gen = sequences if cfg.distributed.rollout == "replicate" else per_rank
    one_step = t.ppo_epochs == 1 and (t.mini_batch_size or sequences) >= sequences
    critic = bool(cfg.critic.enabled)
    old_pass = (t.old_logprob_pass == "always" or not one_step or cfg.algo.kl_coef > 0 or critic
                or bool(getattr(r, "one_step_off", False)))
    lora = cfg.model.lora
    return Workload(sequences=sequences, prompt_tokens=prompt_tokens, new_tokens=r.max_new_tokens,
                    micro_batch=min(micro, per_rank), gen_batch=min(r.max_batch_size, gen), dtype=cfg.model.dtype,
                    chunk_size=t.logprob_chunk_size, ppo_epochs=t.ppo_epochs, old_logprob_pass=old_pass,
                    # a LoRA policy's reference is itself with the adapters off: no second copy
                    reference=cfg.algo.kl_coef > 0 and lora is None,
                    eager_attention=cfg.model.attn_implementation == "eager",
                    activation_checkpointing=t.activation_checkpointing, mixed_precision=t.mixed_precision,
                    optimizer_offload=t.optimizer_offload, lora_rank=lora.r if lora is not None else 0,
                    lora_targets=tuple(lora.target_modules) if lora is not None else ())


def _fmt(n: int, unit: int) -> str:
    return f"{n / unit:10.3f}"


def render(shape: ModelShape, w: Workload, hw: Hardware, strategy: str) -> str:
    """The plan as text: the inputs, a memory table (GiB per rank; DDP and FSDP2), the FLOPs of one step."""
    ddp, fsdp = memory_per_rank(shape, w, "ddp", hw.count), memory_per_rank(shape, w, "fsdp2", hw.count)
    n = param_count(shape)
    unit, name = (GIB, "GiB") if ddp.peak >= GIB else (1024**2, "MiB")
    adapters = lora_params(shape, w.lora_rank, w.lora_targets)
    lora = f"; LoRA r={w.lora_rank} on {','.join(w.lora_targets)}: {adapters:,} trainable" if w.lora_rank else ""
    lines = [f"model: {n:,} parameters (V={shape.vocab} H={shape.hidden} I={shape.intermediate} L={shape.layers} "
             f"heads={shape.heads} kv_heads={shape.kv_heads} tied={shape.tied}), {w.dtype} "
             f"({DTYPE_BYTES[w.dtype]} bytes){lora}",
             f"train: mixed precision {w.mixed_precision}, activation checkpointing "
             f"{'on' if w.activation_checkpointing else 'off'}, optimizer offload "
             f"{'on' if w.optimizer_offload else 'off'}",
             f"hardware: {hw.count} x {hw.kind} with {hw.mem_gb:g} GiB; config strategy: {strategy}",
             f"step: {w.sequences} sequences of {w.prompt_tokens} prompt + {w.new_tokens} new tokens; per rank: "
             f"micro-batch {w.micro_batch}, generation batch {w.gen_batch}; old-log-prob pass: "
             f"{'yes' if w.old_logprob_pass else 'no'}; reference: {'yes' if w.reference else 'no'}",
             "", f"{'memory per rank (' + name + ')':<28}{'DDP':>10}{'FSDP2':>10}"]
    rows = [("parameters", "params"), ("gradients", "grads"), ("AdamW state (2 moments)", "optimizer"),
            ("reference model", "reference"), ("engine copy (unsharded)", "engine_copy"),
            ("gathered FSDP2 unit", "gathered"), ("bf16 weight copy (autocast)", "compute_copy"),
            ("activations (micro-batch)", "activations"), ("KV cache (rollout)", "kv_cache")]
    for label, field in rows:
        lines.append(f"{label:<28}{_fmt(getattr(ddp, field), unit)}{_fmt(getattr(fsdp, field), unit)}")
    lines.append(f"{'peak (upper bound)':<28}{_fmt(ddp.peak, unit)}{_fmt(fsdp.peak, unit)}")
    fits = ["fits" if m.peak <= hw.mem_gb * GIB else "DOES NOT FIT" for m in (ddp, fsdp)]
    lines.append(f"{'fits in ' + format(hw.mem_gb, 'g') + ' GiB':<28}{fits[0]:>10} {fits[1]:>9}")
    if w.optimizer_offload:
        lines.append(f"{'host memory (offload)':<28}{_fmt(ddp.host, unit)}{_fmt(fsdp.host, unit)}")
    f = step_flops(shape, w)
    lines += ["", "FLOPs per RL step (all ranks)"]
    for label, value in (("generation", f.generation), ("training (6N)", f.training),
                         ("old log-prob pass", f.old_logprob), ("reference pass", f.reference),
                         ("total", f.total), ("total per rank", f.total // hw.count)):
        lines.append(f"{label:<28}{value:>14.4e}")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    from credo.config import load_config

    hw = hardware_of(args)
    if args.prompt_tokens < 1:
        raise ValueError("--prompt-tokens must be >= 1")
    cfg = load_config(args.config, args.overrides)
    shape = shape_of(cfg.model)
    print(render(shape, workload_of(cfg, hw.count, args.prompt_tokens), hw, cfg.distributed.strategy))
    return 0
