"""The optimisation inner loops: policy (PPO epochs x mini-batches x micro-batches) and critic.

Each mini-batch's aggregation normalisers are computed once (:class:`AggNorm`), so the summed
micro-batch losses equal the mini-batch loss whatever the micro-batch size (gradient accumulation
is exact). Mini-batch membership is shuffled reproducibly per (seed, step, epoch) when there is
more than one mini-batch.

The loops read small option objects (:class:`UpdateOptions` and its parts, each built from a run's config by
its ``of`` classmethod), not the whole config; the sampling temperature comes with the batch
(``TrainBatch.temperature``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.algo import (AggNorm, compute_policy_loss, policy_loss_inert, policy_loss_requirements,
                        policy_loss_uses_rollout_logprobs)
from credo.algo.critic import compute_critic_loss
from credo.algo.diagnostics import logprob_grad, mechanism_metrics
from credo.algo.rollout_correction import rollout_is_weights
from credo.faults import kill_point
from credo.train.data_parallel import LOCAL, DataParallel
from credo.guards.logprobs import FIRST_RATIO_METRIC, ratio_deviation
from credo.train.forward import ForwardOptions, micro_batches, policy_logprobs, response_outputs, trim
from credo.train.mixed_precision import loss_scaler
from credo.train.loss_terms import LossTerm, TermInputs, build_loss_terms
from credo.train.optim import clip_and_step
from credo.train.stats import MetricAccumulator
from credo.types import TrainBatch

# the critic losses' inputs (credo.algo.critic) that are batch extras, under the same names: the step's return
# quantiles, reference entropy and token rewards (credo.recipes.step), a flow critic's targets and weights; None
# where absent (a loss's ``needs`` says which it requires)
CRITIC_EXTRAS = ("return_quantiles", "ref_entropy", "flow_targets", "flow_weights", "token_rewards")


@dataclass(frozen=True)
class LossSpec:
    """The policy loss, the loss terms added to it (credo.train.loss_terms: KL, entropy, SFT, a method's), and what
    its aggregation divides by (``loss_scale_factor``, else ``max_new_tokens``: :func:`loss_scale`)."""

    policy_loss: str
    agg: str
    rollout_correction: str
    rollout_is_low: float | None
    rollout_is_high: float
    loss_scale_factor: float | None
    max_new_tokens: int
    policy_loss_args: dict[str, Any] = field(default_factory=dict)
    terms: tuple[LossTerm, ...] = ()  # in summation order
    mechanism: bool = False  # log.mechanism: also log the mech/* diagnostics (credo.algo.diagnostics)

    @classmethod
    def of(cls, cfg) -> "LossSpec":
        a = cfg.algo
        return cls(policy_loss=a.policy_loss, agg=a.agg, rollout_correction=rollout_correction_mode(cfg),
                   rollout_is_low=a.rollout_is_low, rollout_is_high=a.rollout_is_high,
                   loss_scale_factor=a.loss_scale_factor, max_new_tokens=cfg.rollout.max_new_tokens,
                   policy_loss_args=dict(a.policy_loss_args), terms=build_loss_terms(cfg),
                   mechanism=cfg.log.mechanism)


def rollout_correction_mode(cfg) -> str:
    """``algo.rollout_correction`` with ``auto`` resolved: ``token_truncate`` where the sampler is another engine
    than the trainer (``rollout.engine=vllm``), ``none`` where it is credo's own (log-probs agree to ~1e-6)."""
    mode = cfg.algo.rollout_correction
    if mode != "auto":
        return mode
    return "token_truncate" if cfg.rollout.engine == "vllm" else "none"


@dataclass(frozen=True)
class Batching:
    """How an update walks a batch (``train.*``): epochs, mini-batches (one optimizer step each, shuffled from
    ``seed``) and micro-batches (one forward and backward each: ``micro_batch_size`` rows, or at most
    ``micro_batch_tokens`` tokens)."""

    ppo_epochs: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    seed: int = 0

    @classmethod
    def of(cls, cfg) -> "Batching":
        t = cfg.train
        return cls(ppo_epochs=t.ppo_epochs, mini_batch_size=t.mini_batch_size, micro_batch_size=t.micro_batch_size,
                   micro_batch_tokens=t.micro_batch_tokens, seed=cfg.seed)


@dataclass(frozen=True)
class CriticLossSpec:
    """The critic's loss (``critic.loss`` with its ``loss_args``) and its max gradient norm (0 = off)."""

    loss: str
    grad_clip: float
    loss_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg) -> "CriticLossSpec":
        c = cfg.critic
        return cls(loss=c.loss, grad_clip=c.grad_clip, loss_args=dict(c.loss_args))


@dataclass(frozen=True)
class UpdateOptions:
    """Everything :func:`update_policy` and :func:`update_critic` read."""

    loss: LossSpec
    batching: Batching
    critic: CriticLossSpec
    forward: ForwardOptions
    grad_clip: float  # the policy's max gradient norm (0 = off)
    skip_zero_advantage: bool

    @classmethod
    def of(cls, cfg) -> "UpdateOptions":
        return cls(loss=LossSpec.of(cfg), batching=Batching.of(cfg), critic=CriticLossSpec.of(cfg),
                   forward=ForwardOptions.of(cfg), grad_clip=cfg.train.grad_clip,
                   skip_zero_advantage=cfg.train.skip_zero_advantage)


def minibatches(b: Batching, batch: TrainBatch, *, step: int):
    """Yield every PPO epoch's mini-batches."""
    size = batch.batch_size
    mini = min(b.mini_batch_size or size, size)
    for epoch in range(b.ppo_epochs):
        order = torch.arange(size)
        if mini < size:
            seed = b.seed * 1_000_003 + step * 101 + epoch
            order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
        for rows in order.split(mini):
            yield batch.select(rows)


def split_micro(b: Batching, mb: TrainBatch) -> list[TrainBatch]:
    """A mini-batch's micro-batches, each trimmed of the columns that are padding in all its rows."""
    return [trim(m) for m in micro_batches(mb, size=b.micro_batch_size, tokens=b.micro_batch_tokens)]


def zero_advantage_rows_inert(opts: UpdateOptions) -> bool:
    """Whether rows whose advantages are all zero may leave the update: the policy loss declares them inert
    (zero loss and gradient, no coupling to other rows) and no other term (KL loss, entropy bonus, SFT on
    correct responses) gives them a gradient."""
    a = opts.loss
    return (opts.skip_zero_advantage and policy_loss_inert(a.policy_loss, a.policy_loss_args)
            and all(t.inert_at_zero_advantage for t in a.terms))


def live_rows(mb: TrainBatch) -> torch.Tensor:
    """(B,) bool: rows with a nonzero advantage on some loss token."""
    return ((mb.advantages != 0) & mb.response_mask.bool()).any(-1)


def update_policy(opts: UpdateOptions, model, batch: TrainBatch, optimizer, scheduler, *, step: int,
                  dp: DataParallel = LOCAL) -> dict[str, float]:
    """PPO epochs over mini-batches (one optimizer step each) of micro-batches.

    When :func:`zero_advantage_rows_inert`, rows with all-zero advantages are left out of the forward and
    backward (the normalisers still count them, so the update is the one the whole mini-batch gives); with no
    live row the optimizer still steps, on zero gradients, as it would have. With ``dp`` over several ranks each
    rank runs its rows of every mini-batch and the gradients are summed before the step
    (:mod:`credo.train.data_parallel`); losses are summed over ranks, token-weighted metrics are this
    rank's."""
    a = opts.loss
    acc = MetricAccumulator()
    model.train()
    scale = loss_scale(a)
    skip = zero_advantage_rows_inert(opts)
    for index, mb in enumerate(minibatches(opts.batching, batch, step=step)):
        norm = AggNorm.of(mb.response_mask, scale)  # the whole mini-batch's counts, on every rank
        prepared = tuple(t.prepare(mb, scale) for t in a.terms)  # e.g. SFT's normalisers over correct responses
        lr = scheduler.get_last_lr()[0]
        local = dp.shard(mb)
        live = live_rows(local) if skip else torch.ones(local.batch_size, dtype=torch.bool)
        losses: dict[str, float] = {}
        micros = split_micro(opts.batching, local if bool(live.all()) else local.select(live.nonzero().flatten())) \
            if bool(live.any()) else []
        factor = dp.backward_factor(model)
        scaler = loss_scaler(optimizer, opts.forward.autocast, next(model.parameters()).device.type)  # fp16 only
        # FSDP2: each backward is a collective, so a rank with fewer micro-batches runs zero-weighted ones along
        rounds = dp.max_over_ranks(len(micros)) if dp.lockstep(model) else len(micros)
        for i in range(rounds):
            if i >= len(micros):
                idle_backward(a, model, mb, norm, prepared, forward=opts.forward)
                continue
            loss, per_update, weighted = actor_loss(a, model, micros[i], norm, prepared, forward=opts.forward,
                                                    first=index == 0)
            loss = loss * factor  # factor 1.0 (exact) unless FSDP2 averages the gradients
            (scaler.scale(loss) if scaler is not None else loss).backward()
            for k, v in per_update.items():
                losses[k] = losses.get(k, 0.0) + v
            acc.add_weighted(weighted, weight=float(micros[i].response_mask.sum()))
        zero_missing_grads(model)
        dp.reduce_grads(model)
        acc.add_per_update(dp.sum_scalars(losses))
        grad_norm = clip_and_step(model, optimizer, scheduler, opts.grad_clip, scaler)
        kill_point("update", step)  # after an optimizer step of the step's update (credo/faults.py)
        acc.add_per_update({"actor/grad_norm": grad_norm, "actor/lr": lr,
                            "actor/skipped_rows_frac": 1.0 - float(live.float().mean()) if len(live) else 1.0})
        acc.end_update()
    return acc.result()


def idle_backward(spec: LossSpec, model, mb: TrainBatch, norm: AggNorm, prepared: tuple, *,
                  forward: ForwardOptions) -> None:
    """A zero-weighted forward and backward (of the mini-batch's first row): no gradient, but the same collectives
    as a real micro-batch, for a sharded policy whose rank has run out of rows."""
    loss, _, _ = actor_loss(spec, model, trim(mb.select(torch.tensor([0]))), norm, prepared, forward=forward)
    (loss * 0.0).backward()


def zero_missing_grads(model) -> None:
    """Zero gradients where there are none, so that the optimizer steps every parameter as after a backward."""
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


def loss_scale(spec: LossSpec) -> float:
    """Constant divisor of seq-mean-token-sum-norm: algo.loss_scale_factor, else the response length cap
    (verl pads responses to max_response_length, so its default is constant across steps too)."""
    return spec.loss_scale_factor or float(spec.max_new_tokens)


def actor_loss(a: LossSpec, model, mb: TrainBatch, norm: AggNorm, prepared: tuple = (), *,
               forward: ForwardOptions, first: bool = False):
    """The policy-gradient loss plus the loss terms (``a.terms``, e.g. + KL loss, - entropy bonus, + SFT on correct
    responses) of one micro-batch, as its share of the mini-batch loss; log-probs at the temperature the batch was
    sampled at. ``prepared``: each term's ``prepare`` of the mini-batch. Returns (loss, per-update metrics,
    token-weighted metrics). ``first``: a micro-batch of the update's first mini-batch (before any optimizer step),
    which also reports ``actor/first_ratio_dev`` (credo.guards.logprobs)."""
    fused = mb.old_logprobs is None  # no separate old-log-prob pass: on-policy, old = current (detached)
    needs_entropy = fused or any(t.needs_entropy for t in a.terms) \
        or "entropy" in policy_loss_requirements(a.policy_loss, a.policy_loss_args)
    logprobs, entropy = policy_logprobs(model, mb, temperature=mb.temperature, with_entropy=needs_entropy,
                                        opts=forward)
    mask = mb.response_mask
    old_logprobs = logprobs.detach() if fused else mb.old_logprobs
    out, weighted = policy_gradient(a, logprobs, old_logprobs, entropy, mb, norm)
    loss = out.loss
    per_update = {"actor/pg_loss": float(out.loss.detach())}
    inputs = TermInputs(logprobs=logprobs, entropy=entropy, batch=mb, agg=a.agg, norm=norm)
    for term, state in zip(a.terms, prepared or (None,) * len(a.terms)):
        contribution = term(dataclasses.replace(inputs, prepared=state))
        if contribution is None:
            continue
        coef, value = contribution
        loss = loss + coef * value
        per_update[term.name] = float(value.detach())
    if first:  # mean |exp(logprobs - rollout_logprobs) - 1|: the first_ratio guard's measure
        weighted[FIRST_RATIO_METRIC] = ratio_deviation(logprobs, mb.rollout_logprobs, mask)
    if fused:  # what the skipped pass would have reported
        n = mask.sum().clamp(min=1.0)
        weighted["actor/entropy"] = float((entropy.detach() * mask).sum() / n)
        weighted["rollout/logprob_abs_diff"] = float(((mb.rollout_logprobs - old_logprobs).abs() * mask).sum() / n)
    return loss, per_update, weighted


def policy_gradient(a: LossSpec, logprobs: torch.Tensor, old_logprobs: torch.Tensor, entropy: torch.Tensor | None,
                    mb: TrainBatch, norm: AggNorm):
    """The registered policy loss (``algo.policy_loss``) after aggregation, with the rollout-correction weights
    (``algo.rollout_correction``) unless the loss computes its own (verl's bypass mode: its old log-probs are the
    sampler's). Returns (LossOutput, token-weighted metrics); with ``a.mechanism`` (``log.mechanism``) the metrics
    also hold the ``mech/*`` diagnostics of the loss's gradient (:func:`credo.algo.diagnostics.mechanism_metrics`)."""
    mask = mb.response_mask
    bypass = policy_loss_uses_rollout_logprobs(a.policy_loss)  # old = the sampler's; the loss weights tokens itself
    loss_old = mb.rollout_logprobs if bypass else old_logprobs
    weights, corr_metrics = None, {}
    if a.rollout_correction != "none" and not bypass:
        weights, corr = rollout_is_weights(old_logprobs, mb.rollout_logprobs, mask, mode=a.rollout_correction,
                                           low=a.rollout_is_low, high=a.rollout_is_high)
        # token means only: they combine exactly over micro-batches (weighted by token counts)
        corr_metrics = {k: corr[k] for k in ("rollout_corr/is_mean", "rollout_corr/adjusted_frac") if k in corr}
    out = compute_policy_loss(a.policy_loss, logprobs=logprobs, old_logprobs=loss_old, advantages=mb.advantages,
                              response_mask=mask, entropy=entropy, ref_logprobs=mb.ref_logprobs, agg=a.agg, norm=norm,
                              token_weights=weights, **a.policy_loss_args)
    metrics = {f"actor/{k}": v for k, v in out.metrics.items()} | corr_metrics
    if a.mechanism:  # the loss's own gradient per token, by region (entropy: the old pass's, else the forward's)
        metrics |= mechanism_metrics(grad=logprob_grad(out.loss, logprobs), logprobs=logprobs, old_logprobs=loss_old,
                                     advantages=mb.advantages, response_mask=mask,
                                     entropy=mb.entropy if mb.entropy is not None else entropy)
    return out, metrics


def update_critic(opts: UpdateOptions, critic, batch: TrainBatch, optimizer, scheduler, *, step: int,
                  dp: DataParallel = LOCAL) -> dict[str, float]:
    """The configured critic loss (``critic.loss``: clipped value regression on ``batch.returns`` by default;
    :mod:`credo.algo.critic`), same batching as the policy (and the same data-parallel split: this rank's rows,
    gradients summed over ranks)."""
    c = opts.critic
    acc = MetricAccumulator()
    critic.train()
    for mb in minibatches(opts.batching, batch, step=step):
        norm = AggNorm.of(mb.response_mask, loss_scale(opts.loss))
        losses: dict[str, float] = {}
        for micro in split_micro(opts.batching, dp.shard(mb)):
            out = response_outputs(critic, micro)
            inputs = {"values": out.values, "quantiles": out.quantiles, "kl": out.kl, "aux": out.aux,
                      "old_values": micro.values, "returns": micro.returns, "ref_logprobs": micro.ref_logprobs,
                      "flow": out.flow} | {name: micro.extras.get(name) for name in CRITIC_EXTRAS}
            loss = compute_critic_loss(c.loss, response_mask=micro.response_mask, agg=opts.loss.agg, norm=norm,
                                       inputs=inputs, **c.loss_args)
            loss.loss.backward()
            losses["critic/vf_loss"] = losses.get("critic/vf_loss", 0.0) + float(loss.loss.detach())
            acc.add_weighted({f"critic/{k}": v for k, v in loss.metrics.items()},
                             weight=float(micro.response_mask.sum()))
        zero_missing_grads(critic)
        dp.reduce_grads(critic)
        acc.add_per_update(dp.sum_scalars(losses, keys=("critic/vf_loss",)))
        acc.add_per_update({"critic/grad_norm": clip_and_step(critic, optimizer, scheduler, c.grad_clip)})
        acc.end_update()
    return acc.result()
