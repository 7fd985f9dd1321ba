"""The RL recipe's LoRA stage (``model.lora``; the adapters themselves are credo.models.lora).

:func:`lora_policy` is the recipe's one call: it refuses the combinations credo does not run, and on a new run
warm-starts the whole base first (SFT trains a freshly built model; adapters alone on a random base would have
nothing to adapt), saves the base once per run directory (``RUN_DIR/base``, unless it is ``model.path``
unchanged), then injects the adapters. A resumed run's policy comes back with its adapter from the checkpoint
(credo.models.build.load_model reads the adapter directory and the base it names).
"""
from __future__ import annotations

import logging
from pathlib import Path

from credo.config import ConfigError
from credo.models import save_model
from credo.models.hub import resolve_model_path
from credo.models.lora import BASE_DIR, UNSUPPORTED_TARGETS, apply_lora
from credo.recipes.common import warm_start, warm_start_enabled
from credo.tracking.metrics import MetricsLogger

log = logging.getLogger(__name__)


def check_lora_config(cfg) -> None:
    """Refuse ``model.lora`` combinations credo does not run (one line each)."""
    lora = cfg.model.lora
    if lora is None:
        return
    bad = [t for t in lora.target_modules if str(t).split(".")[-1] in UNSUPPORTED_TARGETS]
    if bad or not lora.target_modules:
        raise ConfigError(f"model.lora.target_modules={list(lora.target_modules)}: give linear projections of the "
                          "layers (q_proj, ..., down_proj); lm_head / embed_tokens are read as plain weights by "
                          "the chunked log-prob path and the tied head")
    unsupported = {"distributed.backend=ray": cfg.distributed.backend == "ray",
                   "model.arch=llava": cfg.model.arch == "llava" and not cfg.model.path}
    for what, hit in unsupported.items():
        if hit:
            raise NotImplementedError(f"model.lora with {what} is not implemented (docs/lora.md: LoRA runs "
                                      "with rollout.engine=hf or vllm, without Ray workers); drop "
                                      f"{what} or model.lora")


def lora_policy(cfg, model, tokenizer, data, run_dir: Path, *, fresh: bool, resumed: bool):
    """(policy, fresh) for the RL recipe (module docstring). Without ``model.lora``: unchanged. A new LoRA run
    returns ``fresh=False``: its warm start already ran here, on the whole base."""
    check_lora_config(cfg)
    if cfg.model.lora is None or resumed:
        return model, fresh
    warmed = warm_start_enabled(cfg, fresh)
    if warmed:
        with MetricsLogger(run_dir, tensorboard=False) as logger:  # warm_start.jsonl (trackers do not see it)
            warm_start(cfg, model, tokenizer, data, logger)
    base = Path(run_dir) / BASE_DIR if warmed or not cfg.model.path else \
        resolve_model_path(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)  # a hub id: its snapshot
    if warmed or not cfg.model.path:
        save_model(model, tokenizer, base)
    apply_lora(model, cfg.model.lora, seed=cfg.seed)
    model.credo_lora_base = str(base.resolve())  # a plain attribute: named in every checkpoint's base file
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("LoRA r=%d on %s: %s trainable parameters; base %s", cfg.model.lora.r,
             ",".join(cfg.model.lora.target_modules), f"{trainable:,}", base)
    return model, False
