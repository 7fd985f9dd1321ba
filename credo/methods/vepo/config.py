"""VEPO's config: the ``token_select`` section of ``type: vepo`` (was the ``vepo`` section)."""
from __future__ import annotations

from dataclasses import dataclass

from credo.config.fields import opt, type_key
from credo.config.reads import READERS, Reader
from credo.config.validate import ConfigError, register_validator, wrap


@dataclass
class VepoSelectConfig:
    type: str = type_key("vepo", "VEPO grounding-sensitive token selection: a second no-grad forward with the "
                         "prompt's grounding span perturbed; only the top tokens by Vis x entropy keep their loss")
    top_fraction: float = opt(0.2, "share of the valid response tokens selected, k = ceil(fraction * n) (the 80/20 "
                              "rule)", min=0.0, max=1.0)
    jsd_weight: float = opt(1.0, "weight of the JSD between the intact and perturbed next-token distributions",
                            min=0.0)
    gap_weight: float = opt(1.0, "weight of the entropy gap max(H(perturbed) - H(intact), 0)", min=0.0)
    normalize: str = opt("none", "divide each Vis term by its mean over the batch's / sequence's tokens before "
                         "weighting (none = raw nats)", choices=("none", "batch", "sequence"))
    perturb: str = opt("shuffle", "perturbation of the grounding spans: shuffle (permute the span characters), "
                       "random, mask, or module:function (credo.methods.vepo.grounding)")
    perturb_args: dict = opt(None, "perturbation keyword arguments, e.g. {fill: '#'} for mask", factory=dict)
    scope: str = opt("batch", "rank tokens over the whole batch or within each sequence", choices=("batch", "sequence"))
    apply: str = opt("mask", "mask = the selection multiplied into the loss mask; advantage_mask = advantages of "
                     "unselected tokens zeroed (loss mask kept); reweight = advantages times score / mean score",
                     choices=("mask", "advantage_mask", "reweight"))
    max_weight: float = opt(3.0, "apply=reweight: cap of the per-token weights", min=0.0, read_if="vepo_reweight")
    image_perturb: str = opt("gaussian", "image batches (vision-language policies): perturbation of each image's "
                             "raw pixels: gaussian, patch_blacken, grey, blur, resample, or module:function "
                             "(credo.methods.vepo.image)")
    image_perturb_args: dict = opt(None, "image perturbation keyword arguments (gaussian: {std: 0.74}; patch_blacken: "
                                   "{patch: 8, prob: 0.5}; grey: {value: 0.5}; blur: {radius: 6})", factory=dict)
    image_regions: str = opt("whole", "where the image is perturbed: whole = the whole image; meta = the queried "
                             "object's boxes (Example.meta['regions'])", choices=("whole", "meta"))


# the readers of this section's conditional keys (credo.config.reads: no silent no-ops)
READERS.add("vepo_reweight", Reader(lambda c: c.token_select.apply == "reweight", "token_select.apply=reweight"))

@register_validator("token_select.vepo")
def validate_vepo(cfg) -> None:
    """VEPO: a known perturbation with accepted arguments, single-turn prompts, one token selection at a time."""
    v = cfg.token_select
    if v.type != "vepo":
        return
    from credo.methods.vepo.grounding import check_perturbation_args, get_perturbation

    wrap("token_select.perturb", lambda: get_perturbation(v.perturb))
    wrap("token_select.perturb_args", lambda: check_perturbation_args(v.perturb, v.perturb_args))
    from credo.methods.vepo.image import check_image_perturbation_args, get_image_perturbation

    wrap("token_select.image_perturb", lambda: get_image_perturbation(v.image_perturb))
    wrap("token_select.image_perturb_args", lambda: check_image_perturbation_args(v.image_perturb,
                                                                                 v.image_perturb_args))
    if cfg.rollout.collector.type == "agent":
        raise ConfigError("token_select.type=vepo: not implemented for multi-turn agent episodes (VEPO perturbs the "
                          "grounding span of a single-turn prompt)")
