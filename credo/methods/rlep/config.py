"""RLEP's config: the ``replay`` section (``replay: null`` = off; ``credo rlep collect`` reads its collect_*
keys)."""
from __future__ import annotations

from dataclasses import dataclass

from credo.config.fields import opt
from credo.config.reads import READERS, Reader
from credo.config.validate import ConfigError, register_validator


@dataclass
class ReplayConfig:
    pool: str | None = opt(None, "RLEP experience replay: a pool JSONL from `credo rlep collect`; warm_start = "
                           "collect it at the start of the run from the warm-started policy (RUN_DIR/replay_pool.jsonl); "
                           "null = no replay")
    num: int = opt(2, "replayed verified-correct answers added to each prompt's group (M; G' = group_size + M)",
                   min=0)
    fill_missing: bool = opt(False, "the reference code's behaviour: a prompt with fewer than M stored answers gets "
                             "empty responses in the missing slots (scored as failures); false = the group holds "
                             "only the answers that exist")
    negative: int = opt(0, "negative replay: stored failed answers added to each group (needs a pool collected with "
                        "replay.collect_negatives; the paper found no gain)", min=0)
    refresh: bool = opt(False, "add the fresh samples the verifier accepts to the pool during training (the "
                        "reference's dynamic_replay_exp; off: the pool is static)")
    refresh_max: int = opt(16, "refresh: stored answers kept per prompt (the oldest go first)", min=1,
                           read_if="rlep_refresh")
    collect_samples: int = opt(16, "credo rlep collect: answers sampled per prompt (the paper: 64)", min=1,
                               read_if="rlep_collect")
    collect_temperature: float = opt(0.7, "credo rlep collect: sampling temperature", min=0.0, read_if="rlep_collect")
    collect_top_p: float = opt(0.95, "credo rlep collect: nucleus mass", min=0.0, max=1.0, read_if="rlep_collect")
    collect_min_correct: int = opt(2, "credo rlep collect: a prompt is stored only with at least this many verified "
                                   "answers", min=1, read_if="rlep_collect")
    collect_prompts: int | None = opt(None, "credo rlep collect: training prompts to sample (null = all)", min=1,
                                      read_if="rlep_collect")
    collect_negatives: bool = opt(False, "credo rlep collect: also store failed answers (for replay.negative)",
                                  read_if="rlep_collect")


# the readers of this section's conditional keys (credo.config.reads: no silent no-ops); the collect_* keys are
# `credo rlep collect`'s, which reads the same config: harmless to `credo train`, a warning there
READERS.add("rlep_refresh", Reader(lambda c: c.replay.refresh, "replay.refresh=true"))
READERS.add("rlep_collect", Reader(lambda c: False, "`credo rlep collect` (not `credo train`)", harmless=True))

@register_validator("replay")
def validate_replay(cfg) -> None:
    """A replay pool: single-turn groups only, something replayed, a warm-start pool in one process only."""
    p, kind = cfg.replay, cfg.rollout.collector.type
    if p is None or p.pool is None:  # a section without a pool: `credo rlep collect` settings (training: preflight)
        return
    if kind != "group":
        why = "agent episodes are not replayed" if kind == "agent" else "replayed answers have no rollout tree"
        raise ConfigError(f"replay.pool: experience replay is for single-turn groups, rollout.collector.type=group "
                          f"({why})")
    if p.num == 0 and p.negative == 0:
        raise ConfigError("replay.pool: set with replay.num=0 and replay.negative=0 replays nothing")
    if p.pool == "warm_start" and cfg.distributed.backend != "none":
        raise ConfigError("replay.pool=warm_start: not with distributed training (each rank would collect its own "
                          "pool); collect one with `credo rlep collect` and set replay.pool to its path")
