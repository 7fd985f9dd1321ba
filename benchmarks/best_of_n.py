"""Best-of-N on the demo task's held-out prompts: which scorer picks a correct response out of N samples?

    python benchmarks/best_of_n.py --rm RUN/reward_model [--rm RUN2/reward_model] [--birm RUN3/birm] [-n 8]

The generator is the demo's warm-started policy (``credo train``'s defaults: the same seed, so the same SFT warm
start that ``credo rm train`` and ``credo rm train rm.method=birm`` start from). It samples N responses per held-out
prompt at temperature 1; each selector picks one; the table gives the share of prompts whose pick is correct:
avg@N (a random pick), pass@N (an oracle pick), the sampled log-probability (sum), and each reward model
(``ValueModel.load``: a value-head ORM or an implicit reward model) and BiRM (its score ``V_last + beta mean R``).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rm", action="append", default=[], help="a saved reward model directory (repeatable)")
    ap.add_argument("--birm", action="append", default=[], help="a saved BiRM directory (repeatable)")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--step-tokens", type=int, default=2, help="BiRM steps (as it was trained: birm.step_tokens)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from credo.config import load_config
    from credo.data.source import load_task_data
    from credo.models import ValueModel, load_or_build
    from credo.methods.birm.model import BiRewardModel
    from credo.recipes.common import seed_everything, warm_start
    from credo.rewards import RewardRunner
    from credo.rollout import HFRolloutEngine
    from credo.methods.birm.train import score_responses
    from credo.tracking.metrics import MetricsLogger
    from credo.methods.reward_models.train import response_batch, rm_scores
    from credo.types import SamplingParams

    cfg = load_config(None, [f"seed={args.seed}", "log.progress=false"])
    seed_everything(cfg.seed, cfg.train.threads)
    data = load_task_data(cfg.task, seed=cfg.seed)
    policy, tok, _ = load_or_build(cfg.model, seed=cfg.seed)
    with tempfile.TemporaryDirectory() as tmp, MetricsLogger(Path(tmp), tensorboard=False) as logger:
        warm_start(cfg, policy, tok, data, logger)
    engine = HFRolloutEngine(policy, tok, seed=cfg.seed + 1)
    runner = RewardRunner(data.default_reward, executor="inline")
    exs, n = data.eval[: args.prompts], args.n
    trajs = engine.generate(exs, n, SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens))
    correct = torch.tensor([float(r.correct) for r in runner.score([t.response_text for t in trajs],
                                                                    [t.example for t in trajs])]).view(-1, n)

    def pick(key: torch.Tensor) -> float:
        return float(correct.gather(1, key.view(-1, n).argmax(-1, keepdim=True)).mean())

    rows = [("avg@N (random pick)", float(correct.mean())), ("pass@N (oracle pick)", float(correct.max(-1).values.mean())),
            ("sampled log-prob (sum)", pick(torch.tensor([sum(t.rollout_logprobs) for t in trajs])))]
    for path in args.rm:
        rm = ValueModel.load(path).eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            s = torch.cat([rm_scores(rm, response_batch(tok, [t.example.prompt for t in trajs[i : i + 128]],
                                                          [t.response_text for t in trajs[i : i + 128]]))
                           for i in range(0, len(trajs), 128)])
        rows.append((f"reward model {path} ({type(rm).__name__}, {time.perf_counter() - t0:.1f} s)", pick(s)))
    for path in args.birm:
        model = BiRewardModel.load(path)
        s = score_responses(model, tok, [t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                            step_tokens=args.step_tokens)
        rows += [(f"BiRM {path}: V_last + mean R", pick(s["score"])), (f"BiRM {path}: value head", pick(s["value"])),
                 (f"BiRM {path}: reward head", pick(s["reward"]))]
    print(f"best-of-{n} on {len(exs)} held-out prompts of {cfg.task.name} (share of prompts whose pick is correct)")
    for name, acc in rows:
        print(f"  {acc:6.3f}  {name}")


if __name__ == "__main__":
    main()
