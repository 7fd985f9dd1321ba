"""Evidence for the reward models (docs/reward_models.md "Evidence"): best-of-N and label-noise robustness of
Bradley-Terry (BT), CRM, Interaction Distillation (ID-RM) and BiRM against BT and the policy's log-prob, over
seeds, in credo compare's JSON shape (``credo.report.stats.write_compare_json``).

    OMP_NUM_THREADS=1 python benchmarks/evidence_rms.py --seeds 0,1,2,3,4 --noise 0,0.4 \
        --out-dir docs/evidence/data [--steps 40 --pairs 640 --prompts 100 -n 8 --idrm-noise 0]

A seed is the training seed and the data draw: per seed, the demo policy is built and SFT-warm-started
(``credo rm train``'s backbone), the generated reversal pairs are drawn (``rm.pairs`` training, 200 held out), and
the warm-started policy samples ``-n`` responses for each of ``--prompts`` held-out task prompts (the best-of-N
pool, shared by every selector of that seed). Then, for every label-noise rate (the share of training pairs with
chosen and rejected swapped; held-out pairs stay clean), every arm trains from the same warm-started backbone on
the same pairs for ``--steps`` steps:

- ``bt``: a value-head BT reward model (``rm.method=bt``, :func:`credo.methods.reward_models.train.train_bt`);
- ``crm``: CRM's two peer-reviewing value-head models (``rm.method=crm`` defaults: keep 0.6 after half the steps,
  curriculum on; model A is scored), :func:`credo.methods.reward_models.train.train_crm`;
- ``idrm``: BT plus attention alignment to a cross-encoder teacher trained on the same (noisy) pairs for
  ``--teacher-steps`` (``rm.method=idrm`` defaults; no gate: its held-out accuracy is recorded instead), at the
  rates of ``--idrm-noise`` only (clean by default: its paper's claim is clean accuracy),
  :func:`credo.methods.reward_models.idrm.train.train_idrm`;
- ``bt_implicit`` / ``crm_implicit`` (``--implicit``): the same with the LM as an implicit reward model
  (``rm.model=implicit``; CRM without the curriculum, as docs/reward_models.md explains).

Each arm gives its held-out pairwise accuracy and its best-of-N accuracy (the share of prompts whose top-scored
sample is correct). Once per seed, BiRM (``rm.method=birm``) labels ``--birm-prompts`` training prompts' samples by
Monte-Carlo continuations and trains the paper's linear heads and credo's log-ratio heads (``--birm-steps``); the
same pool gives their best-of-N accuracy next to ``logprob`` (the sampled log-prob sum), ``random`` (avg@N) and
``oracle`` (pass@N).

Files (each metric: per-seed values, mean, bootstrap 95% interval, paired difference to the baseline):
``crm_label_noise.json`` and ``idrm_label_noise.json`` (baseline ``bt``; ``pairwise_acc/noise<r>``,
``bon_acc/noise<r>`` and ``pairwise_drop/0-><r>``, the accuracy lost from clean to noise r),
``birm_best_of_n.json`` (baseline ``logprob``; ``bon_acc`` of every selector on clean labels),
``birm_vs_orm.json`` (baseline ``bt``, the outcome reward model; BiRM's two head kinds) and
``crm_idrm_birm_raw.json`` (every per-seed number, resumable: a seed already there is not rerun).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from credo.config import load_config
from credo.data.source import load_task_data
from credo.methods.birm.model import BiRewardModel, LogRatioBiRM
from credo.methods.birm.train import label_steps, score_responses, train_birm
from credo.methods.reward_models.config import RmRunConfig
from credo.methods.reward_models.idrm.student import eager_attention
from credo.methods.reward_models.idrm.teacher import build_teacher, teacher_accuracy, train_teacher
from credo.methods.reward_models.idrm.train import train_idrm
from credo.methods.reward_models.pairs import generate_pairs
from credo.methods.reward_models.recipe import new_reward_model
from credo.methods.reward_models.train import pairwise_accuracy, train_bt, train_crm
from credo.models import load_or_build
from credo.recipes.common import seed_everything, warm_start
from credo.rewards import RewardRunner
from credo.rewards.rm_scoring import response_batch, rm_scores
from credo.rollout import HFRolloutEngine
from credo.tracking.metrics import MetricsLogger
from credo.types import SamplingParams

PAIR_ARMS = ("bt", "crm", "idrm")
IMPLICIT_ARMS = ("bt_implicit", "crm_implicit")


def best_of_n_acc(correct: torch.Tensor, scores: torch.Tensor) -> float:
    """Share of prompts whose highest-scored sample is correct: ``correct`` (P, N) 0/1, ``scores`` (P * N,) or
    (P, N); ties go to the first sample."""
    pick = scores.reshape(correct.shape).argmax(-1, keepdim=True)
    return float(correct.gather(1, pick).mean())


@torch.no_grad()
def response_scores(rm, tok, prompts: list[str], responses: list[str], batch: int = 128) -> torch.Tensor:
    was = rm.training
    rm.eval()
    out = torch.cat([rm_scores(rm, response_batch(tok, prompts[i : i + batch], responses[i : i + batch])).cpu()
                     for i in range(0, len(prompts), batch)])
    rm.train(was)
    return out


def arm_config(seed: int, arm: str, args) -> RmRunConfig:
    method = arm.removesuffix("_implicit")
    over = [f"seed={seed}", f"rm.method={method}", f"rm.pairs={args.pairs}", f"rm.steps={args.steps}",
            "train.threads=1", "log.progress=false", "log.tensorboard=false"]
    if arm.endswith("_implicit"):
        over += ["rm.model=implicit"] + (["rm.curriculum=false"] if method == "crm" else [])
    return load_config(None, over, root=RmRunConfig)


def train_arm(arm: str, cfg, policy, tok, train, held_out) -> tuple[torch.nn.Module, dict[str, float]]:
    """One reward model of ``arm`` trained from ``policy`` (copied) on ``train``; (the model scored, extras)."""
    r, extra = cfg.rm, {}
    common = dict(steps=r.steps, batch_size=r.batch_size, lr=r.lr, seed=cfg.seed, grad_clip=cfg.train.grad_clip)
    if arm in ("bt", "bt_implicit"):
        rm = new_reward_model(cfg, policy, 0)
        train_bt(rm, tok, train, **common)
        return rm, extra
    if arm in ("crm", "crm_implicit"):
        pair = (new_reward_model(cfg, policy, 0), new_reward_model(cfg, policy, 1))
        dropped: list[float] = []

        def on_step(step: int, m: dict[str, float]) -> None:
            dropped.extend(v for k, v in m.items() if k.startswith("crm/dropped_noisy_frac"))

        train_crm(pair, tok, train, keep_final=r.keep_ratio, keep_warmup=r.keep_warmup, curriculum=r.curriculum,
                  on_step=on_step, **common)
        if dropped:
            extra["crm_dropped_flipped"] = sum(dropped) / len(dropped)
        extra["pairwise_acc_b"] = pairwise_accuracy(pair[1], tok, held_out)
        return pair[0], extra
    if arm == "idrm":
        from credo.models import ValueModel

        d = cfg.idrm
        teacher = build_teacher(tok, hidden=d.teacher_hidden, layers=d.teacher_layers, heads=d.teacher_heads,
                                intermediate=d.teacher_intermediate, seed=cfg.seed)
        train_teacher(teacher, tok, train, steps=cfg.idrm.teacher_steps, batch_size=d.teacher_batch_size,
                      lr=d.teacher_lr, grad_clip=cfg.train.grad_clip, seed=cfg.seed)
        extra["teacher_acc"] = teacher_accuracy(teacher, tok, held_out)["mean"]
        rm = ValueModel.from_policy(policy)
        with eager_attention(rm.backbone):
            train_idrm(rm, teacher, tok, train, d, **common)
        return rm, extra
    raise ValueError(f"unknown arm {arm!r}")


def birm_arms(cfg, policy, tok, data, runner, trajs, correct, args) -> dict[str, float]:
    """BiRM (linear heads, the paper's; log-ratio heads, credo's) trained on MC-labelled samples of training
    prompts; best-of-N accuracy of its score on the seed's pool."""
    sampling = SamplingParams.of(cfg.rollout)
    engine = HFRolloutEngine(policy, tok, seed=cfg.seed + 7)
    samples = label_steps(engine, runner, tok, data.train[: args.birm_prompts], samples=4, rollouts=4,
                          step_tokens=args.birm_step_tokens, sampling=sampling)
    out = {}
    for name, model in (("birm_linear", BiRewardModel.from_policy(policy)),
                        ("birm_logratio", LogRatioBiRM.from_policy(policy, cfg.birm.logratio_beta))):
        train_birm(model, tok, samples, steps=args.birm_steps, batch_size=cfg.birm.batch_size, lr=cfg.birm.lr,
                   seed=cfg.seed, grad_clip=cfg.train.grad_clip)
        s = score_responses(model, tok, [t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                            step_tokens=args.birm_step_tokens)
        out[name] = best_of_n_acc(correct, s["score"])
    out["birm_labelled_correct"] = sum(s.correct for s in samples) / max(len(samples), 1)
    return out


def run_seed(seed: int, args) -> dict:
    """Every number of one seed: {"bon": {selector: acc}, "noise": {rate: {arm: {...}}}, "wall_s"}."""
    t0 = time.perf_counter()
    cfg = arm_config(seed, "bt", args)
    seed_everything(seed, 1)
    data = load_task_data(cfg.task, seed=seed)
    policy, tok, _ = load_or_build(cfg.model, seed=seed)
    with tempfile.TemporaryDirectory() as tmp, MetricsLogger(Path(tmp), tensorboard=False) as logger:
        warm_start(cfg, policy, tok, data, logger)
    runner = RewardRunner(data.default_reward, executor="inline")
    engine = HFRolloutEngine(policy, tok, seed=seed + 1)
    trajs = engine.generate(data.eval[: args.prompts], args.n,
                            SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens))
    correct = torch.tensor([float(r.correct) for r in runner.score([t.response_text for t in trajs],
                                                                    [t.example for t in trajs])]).view(-1, args.n)
    prompts, responses = [t.example.prompt for t in trajs], [t.response_text for t in trajs]
    bon = {"random": float(correct.mean()), "oracle": float(correct.max(-1).values.mean()),
           "logprob": best_of_n_acc(correct, torch.tensor([sum(t.rollout_logprobs) for t in trajs]))}
    out: dict = {"bon": bon, "noise": {}}
    arms = list(args.arms) + (list(IMPLICIT_ARMS) if args.implicit else [])
    for noise in args.noise:
        train, held_out = generate_pairs(cfg.task.name, cfg.task.params, train_size=args.pairs, eval_size=200,
                                         seed=seed, noise=noise)
        out["noise"][str(noise)] = {}
        for arm in arms:
            if arm == "idrm" and noise not in args.idrm_noise:
                continue
            t1 = time.perf_counter()
            torch.manual_seed(seed)
            acfg = arm_config(seed, arm, args)
            acfg.idrm.teacher_steps = args.teacher_steps
            rm, extra = train_arm(arm, acfg, policy, tok, train, held_out)
            row = {"pairwise_acc": pairwise_accuracy(rm, tok, held_out),
                   "bon_acc": best_of_n_acc(correct, response_scores(rm, tok, prompts, responses)),
                   "wall_s": round(time.perf_counter() - t1, 1)} | extra
            out["noise"][str(noise)][arm] = row
            print(f"seed {seed} noise {noise} {arm}: {row}", flush=True)
    if args.birm_steps:
        t1 = time.perf_counter()
        bon |= birm_arms(cfg, policy, tok, data, runner, trajs, correct, args)
        print(f"seed {seed} BiRM ({time.perf_counter() - t1:.0f} s): {bon}", flush=True)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def label_noise_metrics(raw: dict, seeds: list[int], arms: list[str], baseline: str) -> dict:
    """``pairwise_acc/noise<r>``, ``bon_acc/noise<r>`` and ``pairwise_drop/0-><r>`` for ``arms``, per seed."""
    from credo.report.stats import metric_block

    rates = [r for r, by_arm in raw[str(seeds[0])]["noise"].items() if all(a in by_arm for a in arms)]
    metrics = {}
    for rate in rates:
        for key in ("pairwise_acc", "bon_acc"):
            values = {a: [raw[str(s)]["noise"][rate][a][key] for s in seeds] for a in arms}
            if key == "bon_acc":  # the log-prob selector beside the arms, on the same pool
                values["logprob"] = [raw[str(s)]["bon"]["logprob"] for s in seeds]
            metrics[f"{key}/noise{rate}@final"] = metric_block(values, baseline)
    clean = rates[0]
    for rate in rates[1:]:
        metrics[f"pairwise_drop/{clean}->{rate}@final"] = metric_block(
            {a: [raw[str(s)]["noise"][clean][a]["pairwise_acc"] - raw[str(s)]["noise"][rate][a]["pairwise_acc"]
                 for s in seeds] for a in arms}, baseline)
    return metrics


def write_all(raw: dict, seeds: list[int], out_dir: Path, command: str, args) -> list[Path]:
    from credo.report.stats import metric_block, write_compare_json

    setup = {"task": "reversal (demo)", "model": "demo 2-layer Qwen2 after its 100-step SFT warm start",
             "steps": args.steps, "pairs": args.pairs, "eval_pairs": 200, "bon_prompts": args.prompts, "n": args.n,
             "teacher_steps": args.teacher_steps, "birm_steps": args.birm_steps, "birm_prompts": args.birm_prompts,
             "noise": args.noise, "idrm_noise": args.idrm_noise, "wall_s_per_seed": [raw[str(s)]["wall_s"] for s in seeds]}
    paths = []
    have = list(raw[str(seeds[0])]["noise"][str(args.noise[0])])
    for name, arm in (("crm_label_noise", "crm"), ("idrm_label_noise", "idrm")):
        if arm not in have:
            continue
        metrics = label_noise_metrics(raw, seeds, ["bt", arm], "bt")
        extra = {"setup": setup}
        if arm == "crm":
            extra["crm_dropped_flipped"] = {r: [raw[str(s)]["noise"][r]["crm"].get("crm_dropped_flipped")
                                                for s in seeds] for r in raw[str(seeds[0])]["noise"]}
        else:
            extra["teacher_acc"] = {r: [raw[str(s)]["noise"][r]["idrm"]["teacher_acc"] for s in seeds]
                                    for r, by_arm in raw[str(seeds[0])]["noise"].items() if "idrm" in by_arm}
        paths.append(write_compare_json(out_dir / f"{name}.json", name=name, command=command, baseline="bt",
                                        seeds=seeds, metrics=metrics, extra=extra))
    clean = str(args.noise[0])
    selectors = {k: [raw[str(s)]["bon"][k] for s in seeds]
                 for k in ("logprob", "random", "oracle", "birm_linear", "birm_logratio") if k in raw[str(seeds[0])]["bon"]}
    selectors |= {a: [raw[str(s)]["noise"][clean][a]["bon_acc"] for s in seeds] for a in have}
    paths.append(write_compare_json(out_dir / "birm_best_of_n.json", name="birm_best_of_n", command=command,
                                    baseline="logprob", seeds=seeds,
                                    metrics={"bon_acc@final": metric_block(selectors, "logprob")},
                                    extra={"setup": setup, "labels": f"clean (noise {clean}) for the pairwise arms"}))
    if "bt" in have and "birm_linear" in selectors:  # BiRM against the outcome reward model (the paper's ORM row)
        orm = {k: selectors[k] for k in ("bt", "birm_linear", "birm_logratio")}
        paths.append(write_compare_json(out_dir / "birm_vs_orm.json", name="birm_vs_orm", command=command,
                                        baseline="bt", seeds=seeds, metrics={"bon_acc@final": metric_block(orm, "bt")},
                                        extra={"setup": setup}))
    return paths


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--noise", default="0,0.4")
    ap.add_argument("--arms", default=",".join(PAIR_ARMS))
    ap.add_argument("--idrm-noise", default="0", help="the noise rates at which the idrm arm runs (its paper "
                    "claims clean accuracy, not noise robustness)")
    ap.add_argument("--implicit", action="store_true", help="also bt_implicit and crm_implicit")
    ap.add_argument("--steps", type=int, default=40, help="reward-model optimizer steps (rm.steps)")
    ap.add_argument("--pairs", type=int, default=640, help="generated training pairs (rm.pairs)")
    ap.add_argument("--teacher-steps", type=int, default=300, help="ID-RM teacher steps (idrm.teacher_steps)")
    ap.add_argument("--prompts", type=int, default=100, help="held-out prompts of the best-of-N pool")
    ap.add_argument("-n", type=int, default=8, help="N of best-of-N")
    ap.add_argument("--birm-steps", type=int, default=40, help="BiRM optimizer steps (0 = no BiRM)")
    ap.add_argument("--birm-prompts", type=int, default=100, help="training prompts step-labelled for BiRM")
    ap.add_argument("--birm-step-tokens", type=int, default=3)
    ap.add_argument("--out-dir", default="docs/evidence/data")
    ap.add_argument("--raw", default=None, help="per-seed numbers (default OUT_DIR/crm_idrm_birm_raw.json); resumable")
    args = ap.parse_args(argv)
    args.noise = [float(x) for x in args.noise.split(",")]
    args.idrm_noise = [float(x) for x in args.idrm_noise.split(",")]
    args.arms = [a for a in args.arms.split(",") if a]
    if args.noise[0] != 0.0:
        raise SystemExit("--noise must start with 0 (the clean reference of the drops)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)
    out_dir = Path(args.out_dir)
    raw_path = Path(args.raw) if args.raw else out_dir / "crm_idrm_birm_raw.json"
    raw = json.loads(raw_path.read_text()) if raw_path.is_file() else {}
    seeds = [int(s) for s in args.seeds.split(",")]
    command = "python benchmarks/evidence_rms.py " + " ".join(sys.argv[1:] if argv is None else argv)
    for seed in seeds:
        if str(seed) not in raw:
            raw[str(seed)] = run_seed(seed, args)
            raw_path.parent.mkdir(parents=True, exist_ok=True)
            raw_path.write_text(json.dumps(raw, indent=1) + "\n")
    for p in write_all(raw, seeds, out_dir, command, args):
        print("wrote", p)


if __name__ == "__main__":
    main()
