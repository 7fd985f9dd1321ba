"""``torchrun ... python tests/distributed/stop_at_step.py train ARGS``: ``credo train`` interrupted by a
KeyboardInterrupt on every rank at RL step ``$CREDO_TEST_STOP_AT`` (the "kill" of the kill-and-resume tests:
test_ddp_resume.py, test_fsdp_resume.py)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# what both kill-and-resume tests run and compare: a tiny model, and metrics rows without what varies run to run
TINY_MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "rollout.max_new_tokens=8", "warm_start.steps=3",
              "warm_start.batch_size=8", "reward.workers=1"]
VOLATILE = ("timing_s/", "perf/", "time", "wall")


def rows(path: Path) -> list[dict]:
    """A run's metrics.jsonl rows without the keys that differ between identical runs (timings, wall clock)."""
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in map(json.loads, open(path))]


if __name__ == "__main__":
    import credo.recipes.rlvr as rlvr
    from credo.cli.main import main

    stop_at, real = int(os.environ["CREDO_TEST_STOP_AT"]), rlvr.rl_step

    def interrupted(cfg, parts, state, *, step):
        if step == stop_at:
            raise KeyboardInterrupt
        return real(cfg, parts, state, step=step)

    rlvr.rl_step = interrupted
    sys.exit(main(["-q", *sys.argv[1:]]))
