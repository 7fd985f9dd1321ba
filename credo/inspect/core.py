"""``inspect_run``: one dumped step replayed through a set of losses and estimators (:class:`Inspection`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from credo.algo.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from credo.config import ConfigError
from credo.inspect.methods import (Disagreement, EstimatorReplay, LossReplay, Skipped, disagreements,
                                   replay_estimator, replay_loss)
from credo.inspect.replay import DTYPE, ReplayBatch, load_batch
from credo.registry import Registry


@dataclass
class Inspection:
    run_dir: Path
    batch: ReplayBatch
    run_loss: str  # the run's algo.policy_loss / algo.advantage / algo.agg
    run_estimator: str
    agg: str
    advantages_source: str  # which advantages the losses were replayed with
    advantages: torch.Tensor  # (B, T) those advantages
    losses: list[LossReplay]
    estimators: list[EstimatorReplay]  # the run's dumped advantages first (as "run"), when dumped
    skipped: list[Skipped]
    disagreements: list[Disagreement]
    loss_disagree: torch.Tensor  # (B, T) bool: some pair of losses disagrees on the token
    estimator_disagree: torch.Tensor  # (B, T) bool: some pair of estimators disagrees


def parse_names(text: str | None, default: str, table: Registry) -> list[str]:
    """Comma-separated registered names (``default`` when empty); ConfigError naming an unknown one."""
    names = [n.strip() for n in (text or default).split(",") if n.strip()]
    for name in names:
        try:
            table.get(name)
        except KeyError as exc:
            raise ConfigError(str(exc.args[0])) from None
    return list(dict.fromkeys(names))


def _hparams(name: str, run_name: str, run_args: dict[str, Any]) -> dict[str, Any]:
    return dict(run_args or {}) if name == run_name else {}


def unreplayed_terms(cfg) -> str | None:
    """A note naming the run's loss terms outside the registered loss (the replay leaves them out), or None."""
    a = cfg.algo
    terms = [f"algo.{k}={getattr(a, k)}" for k in ("kl_coef", "entropy_coef", "sft_coef") if getattr(a, k)]
    if a.kl_coef and a.kl_in_reward:
        terms[0] += " (in the reward: inside the dumped advantages)"
    correction = a.rollout_correction
    if correction == "auto":
        correction = "token_truncate" if cfg.rollout.engine == "vllm" else "none"
    if correction != "none":
        terms.append(f"algo.rollout_correction={correction} (token weights)")
    return f"not replayed (terms outside the registered loss): {', '.join(terms)}" if terms else None


def inspect_run(run_dir: str | Path, step: int, *, losses: str | None = None, estimators: str | None = None,
                device: str | None = None) -> Inspection:
    """Replay step ``step`` of ``run_dir``; ``losses`` / ``estimators`` comma-separated (default: the run's).

    The losses see the run's dumped advantages when the dump has them, else the first estimator that could be
    replayed. The run's own loss and estimator keep its hyperparameters; any other name uses its defaults."""
    run_dir = Path(run_dir)
    batch, cfg = load_batch(run_dir, step, device=device)
    a = cfg.algo
    loss_names = parse_names(losses, a.policy_loss, POLICY_LOSSES)
    est_names = parse_names(estimators, a.advantage, ADVANTAGE_ESTIMATORS)
    skipped: list[Skipped] = []
    ests: list[EstimatorReplay] = []
    if batch.advantages is not None:
        ests.append(EstimatorReplay("run", dict(a.advantage_args or {}), batch.advantages * batch.mask))
    for name in est_names:
        try:
            ests.append(replay_estimator(name, _hparams(name, a.advantage, a.advantage_args), batch))
        except ValueError as exc:
            skipped.append(Skipped("estimator", name, str(exc)))
    if not ests:
        raise ValueError(f"step {step}: no advantages to replay the losses with (none dumped and no estimator "
                         f"could run: {'; '.join(f'{s.name}: {s.reason}' for s in skipped)})")
    adv_source = (f"the run's dumped advantages ({a.advantage})" if ests[0].name == "run"
                  else f"estimator {ests[0].name} (the dump has no advantages)")
    scale = a.loss_scale_factor or float(cfg.rollout.max_new_tokens)
    reps: list[LossReplay] = []
    for name in loss_names:
        try:
            reps.append(replay_loss(name, _hparams(name, a.policy_loss, a.policy_loss_args), batch,
                                    ests[0].advantages, agg=a.agg, loss_scale_factor=scale))
        except ValueError as exc:
            skipped.append(Skipped("loss", name, str(exc)))
    for r in reps:
        if "ref_logprobs" in POLICY_LOSSES[r.name].requirements(r.hparams):
            batch.notes.append(f"{r.name}: ref_logprobs are not dumped; its KL term is replayed against the current "
                               "policy (value and gradient 0)")
    extra = unreplayed_terms(cfg)
    if extra:
        batch.notes.append(extra)
    rows, loss_flag, est_flag = disagreements(reps, ests, batch.mask)
    return Inspection(run_dir=run_dir, batch=batch, run_loss=a.policy_loss, run_estimator=a.advantage, agg=a.agg,
                      advantages_source=adv_source, advantages=ests[0].advantages.to(DTYPE), losses=reps,
                      estimators=ests, skipped=skipped, disagreements=rows, loss_disagree=loss_flag,
                      estimator_disagree=est_flag)
