"""Interaction Distillation's config: the ``idrm`` section of ``credo rm train`` (``rm.method=idrm``)."""
from __future__ import annotations

from dataclasses import dataclass

from credo.config.fields import opt


@dataclass
class IDRMConfig:
    intra_coef: float = opt(1.0, "lambda_intra: weight of the intra-sequence attention alignment (0 = off)", min=0.0)
    inter_coef: float = opt(1.0, "lambda_inter: weight of the inter-sequence (virtual cross-attention) alignment "
                            "(0 = off)", min=0.0)
    intra_rows: str = opt("all", "intra rows aligned: all (every student row with >= 2 causal columns) or last (the "
                          "EOS row against the teacher's [CLS] row)", choices=("all", "last"))
    inter_rope: str = opt("none", "virtual cross-attention: none = pre-RoPE q, k (content only); own_positions = "
                          "RoPE with each sequence's own position ids", choices=("none", "own_positions"))
    layers: str = opt("last", "layer mapping: last = student's last vs teacher's last; uniform = student layer l "
                      "(1-based) vs teacher layer round(l * L_T / L_S)", choices=("last", "uniform"))
    heads: str = opt("mean", "mean = head-mean maps; per_head = head by head (head counts must match)",
                     choices=("mean", "per_head"))
    align_loss: str = opt("kl", "kl = KL(teacher || student) per row; mse = squared error of the probabilities",
                          choices=("kl", "mse"))
    teacher_orders: str = opt("chosen_first", "teacher maps from [CLS] x [SEP] y_w [SEP] y_l [SEP] (chosen_first) "
                              "or the mean of both orders (both: 2 teacher passes)",
                              choices=("chosen_first", "both"))
    teacher: str | None = opt(None, "a saved teacher directory (RUN_DIR/teacher); null = train one first")
    teacher_steps: int = opt(1000, "teacher optimizer steps (BCE on 'first response preferred', random order)",
                             min=1)
    teacher_lr: float = opt(1e-3, "teacher learning rate", min=0.0)
    teacher_batch_size: int = opt(32, "teacher pairs per step", min=1)
    teacher_hidden: int = opt(64, "teacher hidden size (BertConfig)", min=8)
    teacher_layers: int = opt(2, "teacher layers", min=1)
    teacher_heads: int = opt(4, "teacher attention heads", min=1)
    teacher_intermediate: int = opt(128, "teacher MLP size", min=8)
    min_teacher_acc: float = opt(0.8, "stop when the teacher's held-out pairwise accuracy (both orders averaged) is "
                                 "below this: aligning to an uninformed teacher is noise", min=0.0, max=1.0)
