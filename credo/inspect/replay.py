"""A dumped rollout batch (``RUN/rollouts.jsonl``, :mod:`credo.tracking.dump`) as tensors a replay can use.

Where each input comes from (``ReplayBatch.sources`` names it, ``notes`` say what is missing)::

    old_logprobs  the dump's old_logprobs (old-log-prob pass), else its rollout_logprobs (the sampler's; the
                  pass was fused into the update, old = current), else recomputed with the checkpoint of
                  step N - 1 (format-1 dumps), else the current log-probs (ratio 1)
    logprobs      recomputed with the policy after step N (RUN/checkpoints/step_N/model, or RUN/final when N is
                  the run's last step): the ratio of the trained policy against the behaviour policy; else the
                  old log-probs (ratio 1)
    entropy       the dump's (behaviour policy), else the step-N recompute's, else absent
    rewards       the dump's token_rewards (what the estimator saw), else the scores (B,)
    values        the dump's (the critic at collection; runs with a critic), else absent (gae, evpo are skipped)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from credo.config import RunConfig, load_config
from credo.tracking.metrics import read_metrics

DTYPE = torch.float64  # the replay's floating dtype (exact zeros and signs for the disagreement counts)


@dataclass
class ReplayBatch:
    """Step ``step`` of a run: B dumped samples, responses right-padded to T."""

    step: int
    rows: list[dict[str, Any]]  # the dumped rows, in file order
    tokens: list[list[str]]  # (B, n_i) each response token decoded on its own
    mask: torch.Tensor  # (B, T) bool loss mask (False on padding)
    scores: torch.Tensor  # (B,)
    group_ids: torch.Tensor  # (B,) long
    logprobs: torch.Tensor  # (B, T) the policy after step N (or old_logprobs: ratio 1)
    old_logprobs: torch.Tensor  # (B, T) the behaviour policy's
    rollout_logprobs: torch.Tensor  # (B, T) the sampler's (old_logprobs where not dumped)
    advantages: torch.Tensor | None = None  # (B, T) what the run trained on (dumped)
    entropy: torch.Tensor | None = None  # (B, T)
    token_rewards: torch.Tensor | None = None  # (B, T)
    values: torch.Tensor | None = None  # (B, T) the critic's, when the run had one (gae, evpo can replay)
    sources: dict[str, str] = field(default_factory=dict)  # input -> where it came from
    notes: list[str] = field(default_factory=list)  # what is missing or approximated

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def ratio(self) -> torch.Tensor:
        """(B, T) exp(logprobs - old_logprobs) on the loss tokens, 1 elsewhere."""
        return torch.where(self.mask, (self.logprobs - self.old_logprobs).exp(), torch.ones_like(self.logprobs))

    @property
    def rewards(self) -> torch.Tensor:
        """(B, T) token rewards when dumped, else the (B,) scores."""
        return self.token_rewards if self.token_rewards is not None else self.scores


def load_rows(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The dumped rows of ``step``; FileNotFoundError / ValueError in one line when there are none."""
    path = run_dir / "rollouts.jsonl"
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (train with log.rollouts_every=N to dump rollouts)")
    rows = read_metrics(path)
    mine = [r for r in rows if r.get("step") == step]
    if not mine:
        steps = sorted({r.get("step") for r in rows if isinstance(r.get("step"), int)})
        shown = ", ".join(map(str, steps[:20])) + (", ..." if len(steps) > 20 else "")
        raise ValueError(f"{path} has no rows of step {step} (dumped steps: {shown or 'none'})")
    return mine


def run_config(run_dir: Path, notes: list[str]) -> RunConfig:
    path = run_dir / "config.yaml"
    if path.is_file():
        return load_config(str(path), untrusted_dir=run_dir)  # no plugin imported from the run directory
    notes.append("no config.yaml: the run's loss / estimator settings are credo's defaults")
    return load_config(None)


def _padded(rows: list[dict[str, Any]], key: str, width: int, default: float = 0.0) -> torch.Tensor | None:
    """(B, T) of the per-token list ``key`` (None when any row lacks it)."""
    if any(not isinstance(r.get(key), list) for r in rows):
        return None
    out = torch.full((len(rows), width), default, dtype=DTYPE)
    for i, r in enumerate(rows):
        out[i, : len(r[key])] = torch.tensor(r[key], dtype=DTYPE)
    return out


def _model_dir(path: Path) -> bool:
    """A Hugging Face model directory or a LoRA run's PEFT adapter directory (credo.models.load_model reads both)."""
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def checkpoint_model_dir(run_dir: Path, step: int, last_step: int | None) -> Path | None:
    """The policy after ``step``: its intact checkpoint's model, else ``final`` when it is the last step."""
    from credo.train.checkpoint import checkpoint_problem

    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    if ckpt.is_dir() and checkpoint_problem(ckpt) is None and _model_dir(ckpt / "model"):
        return ckpt / "model"
    if step == last_step and _model_dir(run_dir / "final"):
        return run_dir / "final"
    return None


def last_trained_step(run_dir: Path) -> int | None:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    steps = [r["step"] for r in read_metrics(path) if isinstance(r.get("step"), int)]
    return max(steps) if steps else None


def tokenizer_dir(run_dir: Path, cfg: RunConfig, *candidates: Path | None) -> Path | None:
    """A directory with the run's tokenizer: a given model dir, final/, any checkpoint, model.path."""
    dirs = [c for c in candidates if c is not None] + [run_dir / "final"]
    dirs += sorted((run_dir / "checkpoints").glob("step_*/model"), reverse=True)
    if cfg.model.path:
        from credo.models.hub import cached_model_path  # a hub id: its cached snapshot, if any

        dirs.append(cached_model_path(cfg.model.path) or Path(cfg.model.path).expanduser())
    return next((d for d in dirs if (d / "tokenizer_config.json").is_file() or (d / "tokenizer.json").is_file()),
                None)


def decode_tokens(rows: list[dict[str, Any]], tok_dir: Path | None, notes: list[str]) -> list[list[str]]:
    if tok_dir is None:
        notes.append("no tokenizer found (no final/, checkpoint or model.path): tokens are shown as ids")
        return [[f"#{t}" for t in r["response_ids"]] for r in rows]
    from credo.models.build import load_tokenizer

    tok = load_tokenizer(tok_dir)
    return [[tok.decode([t]) for t in r["response_ids"]] for r in rows]


def recompute(model_dir: Path, cfg: RunConfig, rows: list[dict[str, Any]], width: int, temperature: float,
              device: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """No-grad (log-probs, entropy), each (B, T), of the dumped responses under the policy in ``model_dir``."""
    from credo.models import load_model
    from credo.models.batch import token_batch
    from credo.train.forward import ForwardOptions, batched_logprobs

    model_cfg = cfg.model if device is None else dataclasses.replace(cfg.model, device=device)
    model, tok = load_model(model_dir, model_cfg)
    batch = token_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_id=tok.pad_token_id)
    lp, stats = batched_logprobs(model, batch, micro_batch_size=cfg.train.micro_batch_size, temperature=temperature,
                                 stats=("entropy",), opts=ForwardOptions.of(cfg))
    out = []
    for x in (lp, stats["entropy"]):  # (B, T') with T' = the longest response (>= 1)
        full = torch.zeros(len(rows), width, dtype=DTYPE)
        n = min(width, x.shape[1])
        full[:, :n] = x[:, :n].to(DTYPE)
        out.append(full)
    return out[0], out[1]


def _ratio_one_fallback(logprobs: torch.Tensor | None, old: torch.Tensor | None, step: int, shape: tuple[int, int],
                        notes: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, old_logprobs) where one or both are missing: the other one (ratio 1), else zeros; noted."""
    if logprobs is None and old is not None:
        notes.append(f"no checkpoint of step {step} (checkpoint.every) and it is not the final step: ratio 1")
        return old, old
    if logprobs is not None and old is None:
        notes.append("no behaviour log-probs (not dumped, no checkpoint of the step before): ratio 1")
        return logprobs, logprobs
    if logprobs is None:
        notes.append("no log-probs: not in the dump and no checkpoint of this step or the one before; ratio 1 and "
                     "log-probs 0 (losses that read log-probs themselves, e.g. clip_cov / dppo, see zeros)")
        zeros = torch.zeros(shape, dtype=DTYPE)
        return zeros, zeros
    return logprobs, old


def load_batch(run_dir: Path, step: int, *, device: str | None = None) -> tuple[ReplayBatch, RunConfig]:
    """The rows of ``step`` with every replay input filled in as the module docstring says."""
    run_dir = Path(run_dir)
    rows = load_rows(run_dir, step)
    notes: list[str] = []
    cfg = run_config(run_dir, notes)
    width = max(max(len(r["response_ids"]) for r in rows), 1)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        mask[i, : len(r["response_mask"])] = torch.tensor(r["response_mask"], dtype=torch.bool)
    temps = {float(r["temperature"]) for r in rows if isinstance(r.get("temperature"), (int, float))}
    temperature = temps.pop() if len(temps) == 1 else float(cfg.rollout.temperature)
    if "format" not in rows[0]:
        notes.append("format-1 dump (no log-probs, entropy or token rewards): log-probs are recomputed where a "
                     "checkpoint exists")
    sources: dict[str, str] = {}
    old = _padded(rows, "old_logprobs", width)
    rollout = _padded(rows, "rollout_logprobs", width)
    entropy = _padded(rows, "entropy", width)
    if old is not None:
        sources["old_logprobs"] = "dump (the old-log-prob pass)"
    elif rollout is not None:
        old, sources["old_logprobs"] = rollout, "dump's rollout_logprobs (the pass was fused into the update)"
    if entropy is not None:
        sources["entropy"] = "dump (the behaviour policy)"
    last = last_trained_step(run_dir)
    new_dir = checkpoint_model_dir(run_dir, step, last)
    logprobs = None
    if new_dir is not None:
        logprobs, new_entropy = recompute(new_dir, cfg, rows, width, temperature, device)
        sources["logprobs"] = f"recomputed with {new_dir.relative_to(run_dir)}"
        if entropy is None:
            entropy, sources["entropy"] = new_entropy, f"recomputed with {new_dir.relative_to(run_dir)} (not dumped)"
    if old is None:
        prev_dir = checkpoint_model_dir(run_dir, step - 1, None) if step > 1 else None
        if prev_dir is not None:
            old, _ = recompute(prev_dir, cfg, rows, width, temperature, device)
            sources["old_logprobs"] = f"recomputed with {prev_dir.relative_to(run_dir)} (the behaviour policy)"
    logprobs, old = _ratio_one_fallback(logprobs, old, step, (len(rows), width), notes)
    if entropy is None:
        notes.append("no entropy (not dumped, no checkpoint): losses that need it are skipped")
    batch = ReplayBatch(
        step=step, rows=rows, tokens=decode_tokens(rows, tokenizer_dir(run_dir, cfg, new_dir), notes), mask=mask,
        scores=torch.tensor([float(r.get("score", 0.0)) for r in rows], dtype=DTYPE),
        group_ids=torch.tensor([int(r.get("group", i)) for i, r in enumerate(rows)], dtype=torch.long),
        logprobs=logprobs, old_logprobs=old, rollout_logprobs=rollout if rollout is not None else old,
        advantages=_padded(rows, "advantages", width), entropy=entropy,
        token_rewards=_padded(rows, "token_rewards", width), values=_padded(rows, "values", width), sources=sources,
        notes=notes,
    )
    if batch.token_rewards is None:
        notes.append("no token rewards in the dump: estimators read the scores")
    return batch, cfg
