"""On-policy distillation's config: the ``distill`` section (``distill: null`` = off)."""
from __future__ import annotations

from dataclasses import dataclass

from credo.config.fields import opt
from credo.config.reads import READERS, Reader
from credo.config.validate import register_validator, wrap

DISTILL_MODES = ("advantage", "reward", "loss")


@dataclass
class TeacherConfig:
    path: str | None = opt(None, "the teacher: a local Hugging Face directory, loaded frozen on model.device (its "
                           "tokenizer must equal the student's)")
    url: str | None = opt(None, "a vLLM OpenAI-compatible server's base URL scoring the student's tokens with "
                          "prompt_logprobs (temperature 1; its tokenizer must decode the student's ids as the "
                          "student's does)")
    timeout_s: float = opt(600.0, "distill.teacher.url: whole-call deadline of each scoring request (connect to "
                           "the reply's last byte; its reply is capped at 256 MiB)", min=0.001,
                           read_if="distill_teacher_url")


@dataclass
class DistillConfig:
    teacher: TeacherConfig = opt(None, "the teacher model that scores the student's sampled tokens",
                                 factory=TeacherConfig)
    mode: str = opt("advantage", "how the per-token reverse KL (student minus teacher log-prob on the student's "
                    "samples) enters: advantage = A_t = reward_weight * A_t + coef * (teacher - student) (Thinking "
                    "Machines' recipe, undiscounted), reward = dense token rewards into algo.advantage's estimator "
                    "(group-outcome estimators sum them per sequence), loss = coef * a KL estimator term in the "
                    "policy loss", choices=DISTILL_MODES)
    coef: float = opt(1.0, "weight c of the reverse-KL term", min=0.0)
    reward_weight: float = opt(1.0, "weight w of the verifiable reward (reward mode: of the rewards; advantage and "
                               "loss modes: of the estimator's advantages); 0 = pure distillation", min=0.0)
    estimator: str = opt("k2", "loss mode: KL estimator of the loss term (credo.algo.kl: k1, abs, k2, k3, + suffix); "
                         "k2 (and k1+, k3+) give the per-token reverse-KL gradient, plain k1 a zero-mean one",
                         read_if="distill_loss")


# the readers of this section's conditional keys (credo.config.reads: no silent no-ops)
READERS.add("distill_teacher_url", Reader(lambda c: c.distill.teacher.url is not None, "distill.teacher.url"))
READERS.add("distill_loss", Reader(lambda c: c.distill.mode == "loss", "distill.mode=loss"))

@register_validator("distill")
def validate_distill_section(cfg) -> None:
    """:func:`validate_distill`, its ValueError reported as a ConfigError under ``distill``."""
    wrap("distill", lambda: validate_distill(cfg))


def validate_distill(cfg) -> None:
    """A distill section names exactly one teacher and a known estimator; ValueError otherwise (the config loader
    reports it as a ConfigError under ``distill``: :func:`validate_distill_section`)."""
    from credo.algo.kl import canonical_kl

    d = cfg.distill
    if d is None:
        return
    if (d.teacher.path is None) == (d.teacher.url is None):
        raise ValueError("set exactly one of distill.teacher.path (a local HF directory) and distill.teacher.url; "
                         "distill: null switches distillation off")
    try:
        canonical_kl(d.estimator)
    except ValueError as exc:
        raise ValueError(f"distill.estimator: {exc}") from None
