"""VEPO in the recipe: the perturbed-grounding forward and the token selection (``docs/algorithms/vepo.md``).

    prompts'   = perturb(prompt, grounding spans, rng(seed, step, row))      # credo.methods.vepo.grounding
    perturbed  = the batch with prompts' (re-tokenised), the same responses
                 (images: the same input_ids, each image perturbed instead: credo.methods.vepo.image)
    p, q       = the policy's next-token distributions on batch and perturbed  (no grad, micro-batched)
    JSD, H(p), H(q) per response token                                          # credo.methods.vepo.algo
    Vis, score = Vis * H(p), selection / weights -> the batch the policy update sees

The two forwards run micro-batch by micro-batch on the same rows; on the chunked path (the default) only
their final hidden states are kept and the (N, V) logits are formed ``train.logprob_chunk_size`` rows at a time.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from credo.algo import masked_mean
from credo.methods.vepo.algo import (chunked_grounding_stats, grounding_sensitivity, jsd_from_logits, score_weights,
                                  top_fraction_mask, vepo_scores)
from credo.algo.logprobs import entropy_from_logits
from credo.models.tokenizer import encode_prompt
from credo.models.batch import PIXEL_VALUES, collate
from credo.train.forward import (ForwardOptions, _lm_head, _pad_to, _scatter, in_forward, response_hidden,
                                 response_logits, trim)
from credo.methods.vepo.grounding import example_spans, get_perturbation, perturbation_rng, prompt_offset
from credo.methods.vepo.image import perturb_images
from credo.models.vision import normalize_pixels, raw_pixels
from credo.train.packing import valid_responses
from credo.tracking.timer import Timer
from credo.train.transforms import BATCH_TRANSFORMS, BuildContext, StepIO
from credo.types import RewardResult, TrainBatch, Trajectory


@dataclass
class GroundingStats:
    """Per-token statistics of the intact vs perturbed forward, (B, T), zero outside the valid tokens."""

    jsd: torch.Tensor
    entropy: torch.Tensor  # H of the intact distribution
    entropy_perturbed: torch.Tensor

    @property
    def gap(self) -> torch.Tensor:
        return self.entropy_perturbed - self.entropy


@dataclass
class Selection:
    """What VEPO decided for a batch: sensitivity, scores, the hard selection and the credit weights, (B, T)."""

    vis: torch.Tensor
    score: torch.Tensor
    selected: torch.Tensor  # bool
    weights: torch.Tensor  # multiplier of the advantages (apply=reweight) or the 0/1 selection


def perturbed_prompts(trajs: list[Trajectory], *, perturb: str, perturb_args: dict, seed: int, step: int,
                      offset: int = 0) -> list[str]:
    """Each row's prompt with its grounding spans perturbed, deterministically per (seed, step, row)."""
    fn = get_perturbation(perturb)
    out = []
    for row, t in enumerate(trajs):
        text = t.example.prompt
        spans = example_spans(t.example.meta, offset=offset, text_len=len(text), uid=t.example.uid)
        out.append(fn(text, spans, perturbation_rng(seed, step, row), **perturb_args))
    return out


def perturbed_batch(trajs: list[Trajectory], prompts: list[str], tokenizer) -> TrainBatch:
    """The batch of ``trajs`` with each prompt replaced by ``prompts[i]`` (re-tokenised as the rollout engine
    tokenises prompts); responses, masks and scores unchanged. A rollout prompt that does not re-tokenise to its
    own ids (e.g. multi-turn episodes) is a ValueError."""
    rows = []
    for t, text in zip(trajs, prompts):
        if encode_prompt(tokenizer, t.example.prompt) != list(t.prompt_ids):
            raise ValueError(f"VEPO: the prompt of {t.example.uid or 'a row'} does not re-tokenise to the rollout's "
                             "prompt ids (VEPO perturbs single-turn prompts only)")
        rows.append(dataclasses.replace(t, prompt_ids=encode_prompt(tokenizer, text)))
    return collate(rows, [RewardResult(0.0)] * len(rows), pad_id=tokenizer.pad_token_id)


def perturbed_image_batch(batch: TrainBatch, trajs: list[Trajectory], *, perturb: str, perturb_args: dict,
                          regions: str, seed: int, step: int) -> TrainBatch:
    """The batch with each row's image perturbed (raw pixels in [0, 1], then normalised), deterministically per
    (seed, step, row); ``input_ids`` and everything else unchanged (credo.methods.vepo.image)."""
    examples = [t.example for t in trajs]
    raw = raw_pixels([ex.meta["image"] for ex in examples])  # (B, 3, H, W) in [0, 1]
    noisy = perturb_images(raw, [ex.meta for ex in examples], perturb=perturb, perturb_args=perturb_args,
                           regions=regions, seed=seed, step=step)
    pixels = normalize_pixels(noisy).to(batch.extra(PIXEL_VALUES).dtype)
    return dataclasses.replace(batch, extras={**batch.extras, PIXEL_VALUES: pixels})  # the intact batch's untouched


def _micro_grounding(model, intact: TrainBatch, perturbed: TrainBatch, temperature: float, opts: ForwardOptions):
    """(jsd, entropy, entropy_perturbed), each (b, t), of one micro-batch (same rows, same responses)."""
    if opts.chunk_size == 0 and not opts.pack:
        zp = response_logits(model, intact, temperature)  # (b, t, V)
        zq = response_logits(model, perturbed, temperature)  # (b, t, V)
        valid = valid_responses(intact).to(zp.device)  # (b, t)
        return tuple(x * valid for x in (jsd_from_logits(zp, zq), entropy_from_logits(zp), entropy_from_logits(zq)))
    head = _lm_head(model)
    hp, _, valid = response_hidden(model, intact, opts)  # (N, H), (b, t)
    hq, _, valid_q = response_hidden(model, perturbed, opts)
    if not torch.equal(valid, valid_q):
        raise ValueError("VEPO: the intact and perturbed batches have different response positions")
    st = chunked_grounding_stats(hp, hq, head.weight, bias=head.bias, temperature=temperature or 1.0,
                                 chunk_size=opts.chunk_size or None)
    return tuple(_scatter(st[k], valid) for k in ("jsd", "entropy", "entropy_perturbed"))


@torch.no_grad()
def grounding_stats(model, intact: TrainBatch, perturbed: TrainBatch, *, temperature: float = 1.0,
                    micro_batch_size: int | None = None, opts: ForwardOptions = ForwardOptions()) -> GroundingStats:
    """No-grad JSD and entropies of the intact vs perturbed forward per response token, on the CPU."""
    if intact.batch_size != perturbed.batch_size or not torch.equal(intact.responses, perturbed.responses):
        raise ValueError("VEPO: the perturbed batch must hold the same responses as the intact one")
    images, perturbed_images = intact.extras.get(PIXEL_VALUES), perturbed.extras.get(PIXEL_VALUES)
    if (images is None) != (perturbed_images is None) or (
            images is not None and images.shape != perturbed_images.shape):
        raise ValueError("VEPO: the perturbed batch must hold images of the intact batch's shape")
    was_training = model.training
    model.eval()
    width = intact.responses.shape[1]
    out: list[list[torch.Tensor]] = [[], [], []]
    try:
        for rows in torch.arange(intact.batch_size).split(micro_batch_size or intact.batch_size):
            parts = in_forward(model, _micro_grounding, trim(intact.select(rows)), trim(perturbed.select(rows)),
                               temperature, opts)
            for acc, x in zip(out, parts):
                acc.append(_pad_to(x.float().cpu(), width))
    finally:
        model.train(was_training)
    jsd, ent, ent_q = (torch.cat(x) for x in out)
    return GroundingStats(jsd=jsd, entropy=ent, entropy_perturbed=ent_q)


def select(stats: GroundingStats, mask: torch.Tensor, *, top_fraction: float = 0.2, jsd_weight: float = 1.0,
           gap_weight: float = 1.0, normalize: str = "none", scope: str = "batch", apply: str = "mask",
           max_weight: float = 3.0) -> Selection:
    """Vis, score = Vis * H, the top-fraction selection and the credit weights of ``apply``."""
    vis = grounding_sensitivity(stats.jsd, stats.gap, mask, jsd_weight=jsd_weight, gap_weight=gap_weight,
                                normalize=normalize)  # (B, T)
    score = vepo_scores(vis, stats.entropy, mask)  # (B, T)
    selected = top_fraction_mask(score, mask, fraction=top_fraction, scope=scope)  # (B, T) bool
    if apply == "reweight":
        weights = score_weights(score, mask, scope=scope, max_weight=max_weight)
    elif apply in ("mask", "advantage_mask"):
        weights = selected.float()
    else:
        raise ValueError(f"apply must be mask, advantage_mask or reweight, got {apply!r}")
    return Selection(vis=vis, score=score, selected=selected, weights=weights)


def apply_selection(batch: TrainBatch, sel: Selection, apply: str) -> TrainBatch:
    """``mask``: the selection multiplied into the loss mask; ``advantage_mask`` / ``reweight``: the advantages
    multiplied by the 0/1 selection / the score weights, the loss mask unchanged."""
    if apply == "mask":
        return dataclasses.replace(batch, response_mask=batch.response_mask * sel.weights)
    return dataclasses.replace(batch, advantages=batch.advantages * sel.weights)


def selection_metrics(stats: GroundingStats, sel: Selection, mask: torch.Tensor, apply: str) -> dict[str, float]:
    valid = mask.bool()
    unselected = valid & ~sel.selected
    credited = sel.weights > 0 if apply == "reweight" else sel.selected
    out = {"token_select/frac": float(credited.sum()) / max(float(valid.sum()), 1.0),
           "vepo/jsd_mean": float(masked_mean(stats.jsd, mask)),
           "vepo/entropy_gap_mean": float(masked_mean(stats.gap, mask)),
           "vepo/vis_mean": float(masked_mean(sel.vis, mask)),
           "vepo/score_mean": float(masked_mean(sel.score, mask)),
           "vepo/entropy_mean": float(masked_mean(stats.entropy, mask))}
    if sel.selected.any():
        out["vepo/selected_entropy_mean"] = float(stats.entropy[sel.selected].mean())
        out["vepo/selected_jsd_mean"] = float(stats.jsd[sel.selected].mean())
    if unselected.any():
        out["vepo/unselected_entropy_mean"] = float(stats.entropy[unselected].mean())
        out["vepo/unselected_jsd_mean"] = float(stats.jsd[unselected].mean())
    if apply == "reweight":
        out["vepo/weight_max"] = float(sel.weights[valid].max()) if valid.any() else 0.0
    return out


def vepo_step(v, model, tokenizer, batch: TrainBatch, trajs: list[Trajectory], *, seed: int, step: int,
              temperature: float, micro_batch_size: int | None, opts: ForwardOptions,
              offset: int = 0) -> tuple[TrainBatch, dict[str, float]]:
    """The batch the policy update sees under VEPO config ``v`` (a
    :class:`credo.methods.vepo.config.VepoSelectConfig`), and the step's ``vepo/*`` metrics. A batch with images
    (the extra ``pixel_values``) perturbs the images (``v.image_perturb``) and keeps the prompts; a text batch
    perturbs the prompts' grounding spans (``v.perturb``)."""
    images = batch.extras.get(PIXEL_VALUES)  # (B, 3, H, W) or None
    if images is not None:
        perturbed = perturbed_image_batch(batch, trajs, perturb=v.image_perturb, perturb_args=v.image_perturb_args,
                                          regions=v.image_regions, seed=seed, step=step)
        changed = int((perturbed.extra(PIXEL_VALUES) != images).flatten(1).any(-1).sum())
    else:
        prompts = perturbed_prompts(trajs, perturb=v.perturb, perturb_args=v.perturb_args, seed=seed, step=step,
                                    offset=offset)
        perturbed = perturbed_batch(trajs, prompts, tokenizer)
        # rows whose perturbation changed nothing (e.g. shuffling "aaa") carry no grounding signal
        changed = sum(p != t.example.prompt for p, t in zip(prompts, trajs))
    stats = grounding_stats(model, batch, perturbed, temperature=temperature, micro_batch_size=micro_batch_size,
                            opts=opts)
    mask = batch.response_mask
    sel = select(stats, mask, top_fraction=v.top_fraction, jsd_weight=v.jsd_weight, gap_weight=v.gap_weight,
                 normalize=v.normalize, scope=v.scope, apply=v.apply, max_weight=v.max_weight)
    metrics = selection_metrics(stats, sel, mask, v.apply)
    key = "vepo/image_changed_frac" if images is not None else "vepo/prompt_changed_frac"
    metrics[key] = changed / max(len(trajs), 1)
    return apply_selection(batch, sel, v.apply), metrics


class VepoSelector:
    """``token_select.type=vepo``: gradient credit only for the grounding-sensitive tokens, from a second no-grad
    forward of ``model`` with each prompt's grounding span perturbed (:func:`vepo_step`), at the batch's sampling
    temperature. The selection is made from the behaviour policy before the update, so the step keeps its separate
    old-log-prob pass (:class:`VepoTokens` reads ``old_logprobs``)."""

    def __init__(self, v, model, tokenizer, *, seed: int, offset: int, micro_batch_size: int | None,
                 opts: ForwardOptions) -> None:
        self.v, self.model, self.tokenizer, self.seed, self.offset = v, model, tokenizer, seed, offset
        self.micro_batch_size, self.opts = micro_batch_size, opts

    def select(self, batch: TrainBatch, trajs: list[Trajectory], metrics: dict, timer: Timer, *,
               step: int) -> TrainBatch:
        with timer("vepo"):
            out, vepo_metrics = vepo_step(self.v, self.model, self.tokenizer, batch, trajs, seed=self.seed, step=step,
                                          temperature=batch.temperature, micro_batch_size=self.micro_batch_size,
                                          opts=self.opts, offset=self.offset)
        metrics.update(vepo_metrics)
        return out


@dataclass(frozen=True)
class VepoTokens:
    """``token_select.type=vepo`` as a batch transform of the ``policy`` phase (the policy update's view)."""

    selector: VepoSelector
    name: str = "vepo_tokens"
    phase: str = "policy"
    order: int = 10
    reads: tuple[str, ...] = ("old_logprobs",)
    writes: tuple[str, ...] = ("response_mask", "advantages")

    def __call__(self, batch: TrainBatch, rewards, io: StepIO):
        return self.selector.select(batch, io.trajs, io.metrics, io.timer, step=io.step), rewards


@BATCH_TRANSFORMS.register("vepo_tokens")
def _vepo_tokens(ctx: BuildContext) -> VepoTokens | None:
    cfg = ctx.cfg
    if cfg.token_select.type != "vepo":
        return None
    offset = prompt_offset(cfg.task.prompt_template, chat=cfg.task.chat_template, tokenizer=ctx.tokenizer)
    return VepoTokens(VepoSelector(cfg.token_select, ctx.model, ctx.tokenizer, seed=cfg.seed, offset=offset,
                                   micro_batch_size=cfg.train.micro_batch_size, opts=ForwardOptions.of(cfg)))
