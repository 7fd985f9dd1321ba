"""``credo rm train``'s config: its root :class:`RmRunConfig` and its ``rm`` section (``birm``:
:mod:`credo.methods.birm.config`; ``idrm``: :mod:`credo.methods.reward_models.idrm.config`)."""
from __future__ import annotations

from dataclasses import dataclass

from credo.config.fields import opt
from credo.config.schema import (DistributedConfig, LogConfig, ModelConfig, RewardConfig, RolloutConfig, TaskConfig,
                                 TrainConfig, WarmStartConfig)
from credo.methods.birm.config import BiRMConfig
from credo.methods.reward_models.idrm.config import IDRMConfig


@dataclass
class RewardModelConfig:
    method: str = opt("bt", "credo rm train: bt = one Bradley-Terry reward model; crm = two peer-reviewing models "
                      "(CRM); birm = BiRM's process reward model on self-labelled steps (birm.*); idrm = Interaction "
                      "Distillation, BT plus attention alignment to a cross-encoder teacher (idrm.*; "
                      "interaction_distillation is the same; docs/reward_models.md)",
                      choices=("bt", "crm", "birm", "idrm", "interaction_distillation"))
    train_file: str | None = opt(None, "JSONL preference pairs (prompt, chosen, rejected); null = generated from task")
    eval_file: str | None = opt(None, "held-out JSONL pairs; null = generated from task (or 10% of train_file)")
    pairs: int = opt(4000, "generated training pairs (one per task example)", min=1)
    eval_pairs: int = opt(200, "generated held-out pairs", min=1)
    noise: float = opt(0.0, "share of generated training pairs with chosen and rejected swapped", min=0.0, max=1.0)
    model: str = opt("value_head", "value_head = a scalar head on the backbone (ORM); implicit = the LM itself, "
                     "r = beta * sum_t log pi / pi_ref (DPO's implicit reward; credo.models.implicit)",
                     choices=("value_head", "implicit"))
    beta: float = opt(0.1, "rm.model=implicit: beta of the implicit reward", min=0.0)
    pooling: str = opt("last", "value_head: a response's reward is the head at its last token (last, the usual ORM) "
                       "or the mean over its tokens (mean)", choices=("last", "mean"))
    steps: int = opt(400, "optimizer steps", min=1)
    batch_size: int = opt(32, "pairs per step", min=1)
    lr: float = opt(1e-3, "learning rate", min=0.0)
    margin: float = opt(0.0, "Bradley-Terry margin m in -log sigma(r_w - r_l - m)")
    eval_every: int = opt(100, "held-out pairwise accuracy every N steps (0 = at the end only)", min=0)
    keep_ratio: float = opt(0.6, "crm: final share of each mini-batch a model keeps for its peer (by margin)",
                            min=0.01, max=1.0)
    keep_warmup: float = opt(0.5, "crm: share of the steps over which the kept share falls from 1 to keep_ratio",
                             min=0.0, max=1.0)
    curriculum: bool = opt(True, "crm: order pairs easy to hard by the two models' mean margin each pass")

    def __post_init__(self) -> None:
        if self.method == "interaction_distillation":  # the long name of idrm
            self.method = "idrm"


@dataclass
class RmRunConfig:
    """The config root of ``credo rm train``: the sections it reads, plus ``rm``, ``birm`` and ``idrm``."""

    seed: int = opt(0, "global seed")
    output_dir: str = opt("runs", "parent directory of run directories")
    run_name: str | None = opt(None, "run directory name (null = TASK-rm-METHOD-TIMESTAMP)")
    model: ModelConfig = opt(None, factory=ModelConfig)
    task: TaskConfig = opt(None, factory=TaskConfig)
    rollout: RolloutConfig = opt(None, factory=RolloutConfig)
    reward: RewardConfig = opt(None, factory=RewardConfig)
    train: TrainConfig = opt(None, factory=TrainConfig)
    warm_start: WarmStartConfig = opt(None, factory=WarmStartConfig)
    log: LogConfig = opt(None, factory=LogConfig)
    distributed: DistributedConfig = opt(None, factory=DistributedConfig)
    rm: RewardModelConfig = opt(None, factory=RewardModelConfig)
    birm: BiRMConfig = opt(None, factory=BiRMConfig)
    idrm: IDRMConfig = opt(None, factory=IDRMConfig)
