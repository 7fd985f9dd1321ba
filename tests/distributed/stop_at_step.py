"""``torchrun ... python tests/distributed/stop_at_step.py train ARGS``: ``credo train`` interrupted by a
KeyboardInterrupt on every rank at RL step ``$CREDO_TEST_STOP_AT`` (the "kill" of the kill-and-resume tests:
test_ddp_resume.py, test_fsdp_resume.py)."""
from __future__ import annotations

import os
import sys

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
