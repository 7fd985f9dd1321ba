"""Time to held-out accuracy: credo vs TRL's GRPOTrainer on SmolLM2-135M-Instruct (`vs_trl.py --time-to-accuracy`).

Both sides train SmolLM2-135M-Instruct (the prepared directory, credo.models.smollm2) on one-digit sums asked
through its chat template ("What is 3+4=? Reply with the number only.", reward: the `number` verifier) from the same
weights, with the same prompt batches in the same order (credo's PromptSampler order for the run seed, handed to TRL
as an unshuffled dataset), group size, temperature 1, max new tokens, learning rate, AdamW (betas 0.9 / 0.999, eps
1e-8, no weight decay), constant learning rate without warm-up, gradient clipping at 1.0, no KL, one optimizer step
per rollout batch, loss averaged over all response tokens of the batch (TRL `loss_type="dapo"`, credo
`algo.agg=token-mean`) and GRPO advantages (r - mean) / (std + 1e-4) over each group (unbiased std, as TRL). The
seed sets the prompt order and the sampling on both sides.

Every `--eval-every` steps, one evaluator (`GreedyEvaluator`: the same code, tokenizer, held-out prompts disjoint
from the training ones, greedy decoding with transformers' `generate` and the `number` verifier) scores the policy
in the training process, its time taken out of the training clock: TRL from a `TrainerCallback.on_step_end`, credo
from a wrapper around `credo.recipes.rlvr.rl_step` (credo has no step callback). The clock starts when the first step
starts; a side stops at its first evaluation at or above `--threshold` (or after `--max-steps`: censored, reported
as such, never dropped). Seeds run interleaved (TRL seed 0, credo seed 0, TRL seed 1, ...) in fresh processes, so a
change of the machine's load falls on both. Result: the median over seeds of the per-seed ratios credo time / TRL
time, with an exact percentile bootstrap over seeds (all n^n resamples for n <= 6), printed as
`credo / TRL time to NN% held-out accuracy: R x [lo, hi]`; every evaluation of every run goes to a JSON file
(docs/performance.md, "Time to accuracy against TRL").
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import harness

ADV_EPS = 1e-4  # TRL's GRPO advantage (r - mean) / (std + 1e-4); credo's grpo estimator takes it as eps
EXACT_MAX_SEEDS = 6  # exact bootstrap (n^n resamples) up to this many seeds, the seeded bootstrap beyond


# ---------------------------------------------------------------- statistics (pure)


@dataclass(frozen=True)
class Point:
    """One held-out evaluation: after `step` optimizer steps, `time_s` seconds of training (evaluations left out)."""

    step: int
    time_s: float
    acc: float


def first_crossing(points: Sequence[Point], threshold: float) -> Optional[Point]:
    """The first evaluation (in step order) whose accuracy is >= threshold; None if none is (censored)."""
    return next((p for p in sorted(points, key=lambda p: p.step) if p.acc >= threshold), None)


def seed_outcome(points: Sequence[Point], threshold: float) -> dict:
    """A run's result: reached (and the time, step, accuracy of the first crossing) or censored (then `time_s` is
    the training time it ran without reaching the threshold: a lower bound), and its last evaluation."""
    if not points:
        raise ValueError("a run without evaluations has no time to accuracy")
    last = max(points, key=lambda p: p.step)
    hit = first_crossing(points, threshold)
    at = hit or last
    return {"reached": hit is not None, "time_s": at.time_s, "step": at.step, "acc": at.acc,
            "final_step": last.step, "final_acc": last.acc}


def exact_bootstrap_ci(ratios: Sequence[float], level: float = 0.95, *, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the median of `ratios` over resamples with replacement: for n <= EXACT_MAX_SEEDS all
    n^n equally likely resamples (no randomness), beyond that harness.bootstrap_ci's seeded resampling."""
    n = len(ratios)
    if n == 0:
        raise ValueError("no ratios to resample")
    if n > EXACT_MAX_SEEDS:
        return harness.bootstrap_ci([1.0] * n, list(ratios), True, seed=seed, level=level)
    medians = [statistics.median(sample) for sample in itertools.product(ratios, repeat=n)]
    tail = (1.0 - level) / 2
    return harness.quantile(medians, tail), harness.quantile(medians, 1.0 - tail)


def paired_ratio(trl: Sequence[dict], credo: Sequence[dict], level: float = 0.95) -> dict:
    """credo / TRL over seeds paired by index: the median of the per-seed time ratios of the seeds where both sides
    reached the threshold, its exact_bootstrap_ci, and the seeds left out because a side was censored (with the
    bound their ratio has: credo censored -> ratio > bound, TRL censored -> ratio < bound)."""
    if len(trl) != len(credo):
        raise ValueError(f"paired seeds differ in number: TRL {len(trl)}, credo {len(credo)}")
    ratios, censored = [], []
    for i, (t, c) in enumerate(zip(trl, credo)):
        if t["reached"] and c["reached"]:
            ratios.append(c["time_s"] / t["time_s"])
        else:
            kind = "both" if not (t["reached"] or c["reached"]) else ("credo" if not c["reached"] else "TRL")
            bound = None if kind == "both" else c["time_s"] / t["time_s"]
            censored.append({"seed_index": i, "censored": kind, "ratio_bound": bound,
                             "relation": {"credo": ">", "TRL": "<"}.get(kind)})
    out = {"ratios": ratios, "censored": censored, "n": len(ratios)}
    if ratios:
        out["ratio"] = statistics.median(ratios)
        out["lo"], out["hi"] = exact_bootstrap_ci(ratios, level)
    return out


def ratio_line(threshold: float, summary: dict) -> str:
    name = f"credo / TRL time to {threshold:.0%} held-out accuracy"
    if not summary["ratios"]:
        return f"{name}: no seed where both reached it"
    return f"{name}: {summary['ratio']:.2f} x [{summary['lo']:.2f}, {summary['hi']:.2f}]"


# ---------------------------------------------------------------- the common evaluator and the shared data


class GreedyEvaluator:
    """Held-out greedy accuracy, the same on both sides: chat-formatted prompts left-padded in one batch,
    transformers' `generate` without sampling (its own GenerationConfig, so neither trainer's settings leak in),
    the new tokens decoded without special tokens and scored by credo's `number` verifier."""

    def __init__(self, model_dir: str, examples, max_new_tokens: int, template: str):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        self.examples = list(examples)
        texts = [self.tok.apply_chat_template([{"role": "user", "content": template.format(prompt=ex.prompt)}],
                                              tokenize=False, add_generation_prompt=True) for ex in self.examples]
        self.batch = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        self.max_new_tokens = max_new_tokens

    def __call__(self, model) -> tuple[float, list[str]]:
        import torch
        from transformers import GenerationConfig

        from credo.rewards.verifiers import number

        gen = GenerationConfig(do_sample=False, max_new_tokens=self.max_new_tokens, pad_token_id=self.tok.pad_token_id,
                               eos_token_id=self.tok.eos_token_id, use_cache=True)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model.generate(**self.batch, generation_config=gen)
        finally:
            model.train(was_training)
        replies = self.tok.batch_decode(out[:, self.batch["input_ids"].shape[1]:], skip_special_tokens=True)
        scores = [number(r, ex).score for r, ex in zip(replies, self.examples)]
        return sum(scores) / len(scores), replies


def splits(args):
    """The training pool and the held-out set, fixed across seeds (task seed 0): the same call credo makes."""
    from credo.data.tasks import build_splits, get_task

    return build_splits(get_task("addition", digits=1), train_size=args.train_size, eval_size=args.eval_size, seed=0)


def train_order(train, seed: int, prompts: int, steps: int):
    """The prompts credo's sampler draws for a run seed, batch after batch (credo.data.sampler.PromptSampler with
    the run seed, as the recipe builds it): TRL gets them in this order, unshuffled."""
    from credo.data.sampler import PromptSampler

    sampler = PromptSampler(train, seed=seed)
    return [ex for _ in range(steps) for ex in sampler.next_batch(prompts)]


class Clock:
    """Training time with the evaluations left out: starts at the first step, `pause` around each evaluation."""

    def __init__(self):
        self.t0: float | None = None
        self.paused = 0.0

    def start(self) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0 - self.paused


class Recorder:
    """Evaluates every `every` steps (and at step 0, before the clock), keeps the points, says when to stop."""

    def __init__(self, evaluator: GreedyEvaluator, every: int, threshold: float):
        self.evaluator, self.every, self.threshold = evaluator, every, threshold
        self.clock = Clock()
        self.points: list[Point] = []
        self.replies: dict[int, list[str]] = {}

    def evaluate(self, model, step: int) -> bool:
        """After `step` steps: record a point when due; True when it reached the threshold (stop)."""
        if step and step % self.every:
            return False
        t = self.clock.now() if step else 0.0
        t_eval = time.perf_counter()
        acc, replies = self.evaluator(model)
        if step:
            self.clock.paused += time.perf_counter() - t_eval
        self.points.append(Point(step, t, acc))
        self.replies[step] = replies[:8]
        print(f"step {step}: {t:.1f} s, held-out greedy accuracy {acc:.3f}", file=sys.stderr, flush=True)
        return step > 0 and acc >= self.threshold

    def result(self, **extra) -> dict:
        return {"points": [asdict(p) for p in self.points], "replies": self.replies, **extra}


# ---------------------------------------------------------------- one run of each side (child processes)


def _trl_config(args, out: Path, seed: int):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, use_vllm=False, gradient_checkpointing=False,
        per_device_train_batch_size=args.prompts * args.group, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=args.group, max_completion_length=args.max_new_tokens, num_iterations=1, beta=0.0,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        loss_type="dapo", scale_rewards="group", max_steps=args.max_steps, logging_steps=1, save_strategy="no",
        report_to="none", seed=seed, data_seed=seed, disable_tqdm=True, dataloader_num_workers=0,
        shuffle_dataset=False)


def run_trl(args, model_dir: str, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    import vs_trl
    from credo.models import load_model
    from credo.rewards.verifiers import number
    from credo.types import Example

    t_setup = time.perf_counter()
    torch.set_num_threads(args.threads)
    train, held_out = splits(args)
    recorder = Recorder(GreedyEvaluator(model_dir, held_out, args.max_new_tokens, vs_trl.CHAT_TEMPLATE),
                        args.eval_every, args.threshold)
    model, tok = load_model(model_dir)
    tok.padding_side = "left"
    order = train_order(train, args.run_seed, args.prompts, args.max_steps)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": vs_trl.CHAT_TEMPLATE.format(prompt=ex.prompt)}],
                               "answer": ex.answer} for ex in order])

    def reward(completions, answer, **_):  # the verifier credo uses: the last number of the reply
        return [number(c[0]["content"], Example("", a, "")).score for c, a in zip(completions, answer)]

    rewards: list[float] = []

    class Evaluate(TrainerCallback):
        def on_train_begin(self, _args, state, control, model=None, **k):
            recorder.evaluate(model, 0)

        def on_step_begin(self, *a, **k):
            recorder.clock.start()

        def on_step_end(self, _args, state, control, model=None, **k):
            if recorder.evaluate(model, state.global_step):
                control.should_training_stop = True

        def on_log(self, *a, logs=None, **k):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=_trl_config(args, out, args.run_seed),
                          train_dataset=data, processing_class=tok, callbacks=[Evaluate()])
    setup_s = time.perf_counter() - t_setup
    trainer.train()
    return recorder.result(reward=rewards, setup_s=setup_s)


class _Stop(Exception):
    """Raised from the step wrapper at the first evaluation at or above the threshold: ends credo's run there."""


def run_credo(args, model_dir: str, out: Path) -> dict:
    import credo.recipes.rlvr as rlvr
    import vs_trl
    from credo.config import load_config

    t_setup = time.perf_counter()
    _, held_out = splits(args)
    recorder = Recorder(GreedyEvaluator(model_dir, held_out, args.max_new_tokens, vs_trl.CHAT_TEMPLATE),
                        args.eval_every, args.threshold)
    step_fn, setup, rewards = rlvr.rl_step, {}, []

    def timed_step(cfg, parts, state, *, step):
        if not recorder.points:  # the step-0 evaluation, before the clock starts
            setup["setup_s"] = time.perf_counter() - t_setup
            recorder.evaluate(parts.model, 0)
        recorder.clock.start()
        metrics = step_fn(cfg, parts, state, step=step)
        rewards.append(float(metrics.get("reward/mean", float("nan"))))
        if recorder.evaluate(parts.model, step + 1):
            raise _Stop
        return metrics

    rlvr.rl_step = timed_step  # credo has no step callback: the recipe looks rl_step up on each step
    overrides = [
        f"model.path={model_dir}", "warm_start.enabled=false", "task.name=addition", 'task.params={"digits": 1}',
        f"task.train_size={args.train_size}", f"task.eval_size={args.eval_size}", "task.seed=0",
        "task.chat_template=true", f"task.prompt_template={vs_trl.CHAT_TEMPLATE}", "reward.name=number",
        f"seed={args.run_seed}", f"train.steps={args.max_steps}", f"train.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.max_new_tokens}",
        "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=0", "algo.kl_coef=0", "algo.agg=token-mean",
        "algo.advantage=grpo", f'algo.advantage_args={{"eps": {ADV_EPS}}}', "train.ppo_epochs=1",
        f"train.lr={args.lr}", "train.betas=[0.9,0.999]", "train.weight_decay=0", "train.warmup_steps=0",
        "train.lr_schedule=constant", "train.grad_clip=1.0", "eval.every=0", "eval.size=1", "eval.k=1",
        "checkpoint.every=0", "checkpoint.save_final=false", "log.report=false", "log.tensorboard=false",
        "log.progress=false", f"train.threads={args.threads}", *args.credo]
    try:
        rlvr.train(load_config(None, overrides), run_dir=out / "credo")
    except _Stop:
        pass
    finally:
        rlvr.rl_step = step_fn
    return recorder.result(reward=rewards, **setup)


# ---------------------------------------------------------------- the comparison (parent process)


def add_arguments(ap) -> None:
    g = ap.add_argument_group("time to accuracy (--time-to-accuracy)")
    g.add_argument("--time-to-accuracy", action="store_true", help="instead of step times: wall time until "
                   "held-out greedy accuracy first reaches --threshold, SmolLM2 on one-digit sums, per seed")
    g.add_argument("--seeds", type=int, default=3, help="run seeds 0..N-1 (prompt order and sampling)")
    g.add_argument("--threshold", type=float, default=0.9, help="held-out greedy accuracy to reach")
    g.add_argument("--max-steps", type=int, default=8, help="step budget per run (censored if not reached)")
    g.add_argument("--eval-every", type=int, default=1, help="steps between held-out evaluations")
    g.add_argument("--eval-size", type=int, default=40, help="held-out one-digit sums (of the 100)")
    g.add_argument("--train-size", type=int, default=200, help="training examples drawn from the other sums")
    g.add_argument("--lr", type=float, default=5e-5, help="learning rate (both sides)")
    g.add_argument("--run-seed", type=int, default=0, help=argparse.SUPPRESS)


def _child(args, side: str, model_dir: str, out: Path, seed: int) -> dict:
    run_out = tempfile.mkdtemp(dir=out, prefix=f"{side}-{seed}-")
    argv = [sys.executable, str(Path(__file__).with_name("vs_trl.py")), "--time-to-accuracy", "--only", side,
            "--model-dir", model_dir, "--out", run_out, "--run-seed", str(seed), "--threads", str(args.threads),
            "--prompts", str(args.prompts), "--group", str(args.group), "--max-new-tokens", str(args.max_new_tokens),
            "--threshold", str(args.threshold), "--max-steps", str(args.max_steps), "--eval-every",
            str(args.eval_every), "--eval-size", str(args.eval_size), "--train-size", str(args.train_size),
            "--lr", str(args.lr)] + (["--credo", *args.credo] if args.credo and side == "credo" else [])
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode:
        sys.exit(f"{side} seed {seed} failed (exit {proc.returncode}): {' '.join(argv)}\n{proc.stderr[-3000:]}")
    value = _parse(proc.stdout)
    value["process_s"] = time.perf_counter() - t0
    return value


def _parse(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("TTA "):
            return json.loads(line[4:])
    raise ValueError(f"no TTA line in the output: {stdout[-300:]!r}")


def describe(args) -> dict:
    """Each side's configuration, as printed and stored (what both share, then what differs)."""
    return {
        "shared": f"SmolLM2-135M-Instruct (prepared dir), one-digit sums through the chat template, {args.prompts} "
                  f"prompts x {args.group} samples, <= {args.max_new_tokens} new tokens, temperature 1, lr {args.lr:g} "
                  f"constant (no warm-up), AdamW 0.9/0.999/1e-8, no weight decay, clip 1.0, no KL, one update per "
                  f"batch, token-mean loss, GRPO advantages (std + 1e-4), {args.threads} torch threads",
        "TRL": "GRPOTrainer on the CPU: use_cpu, float32, use_vllm=False (transformers generate), no gradient "
               "checkpointing, loss_type=dapo, num_iterations=1, steps_per_generation=1",
        "credo": "train() with its defaults (HF engine with the lean decode loop, old-logprob pass skipped, "
                 "zero-advantage rows skipped, shared-prompt forward with packed responses, fused AdamW)"
                 + (f"; overrides {' '.join(args.credo)}" if args.credo else ""),
    }


def _print_runs(label: str, outcomes: list[dict], runs: list[dict]) -> None:
    for seed, (o, run) in enumerate(zip(outcomes, runs)):
        state = "reached" if o["reached"] else "CENSORED (not reached)"
        first = run["points"][0]["acc"]
        print(f"  {label} seed {seed}: {state} at step {o['step']}, {o['time_s']:.1f} s (acc {o['acc']:.3f}); "
              f"start acc {first:.3f}, last acc {o['final_acc']:.3f} at step {o['final_step']}; "
              f"mean train reward {statistics.mean(run['reward']) if run['reward'] else float('nan'):.3f}")


def main(args) -> None:
    args.model, args.chat = "smollm2", True
    args.max_new_tokens = args.max_new_tokens or 16
    if args.only in ("trl", "credo"):
        fn = run_trl if args.only == "trl" else run_credo
        print("TTA " + json.dumps(fn(args, args.model_dir, Path(args.out))), flush=True)
        return
    if not 0.0 < args.threshold <= 1.0:
        sys.exit(f"--threshold must lie in (0, 1] (got {args.threshold})")
    config = describe(args)
    print(f"time to {args.threshold:.0%} held-out greedy accuracy ({args.eval_size} held-out sums, evaluated every "
          f"{args.eval_every} step(s), at most {args.max_steps} steps, seeds 0..{args.seeds - 1})", flush=True)
    for key, text in config.items():
        print(f"  {key}: {text}")
    before = harness.machine_state()
    runs: dict[str, list[dict]] = {"TRL": [], "credo": []}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, str(Path(__file__).with_name("vs_trl.py")), "--model", "smollm2",
                               "--only", "prepare", "--out", tmp], capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("MODEL ")), None)
        if proc.returncode or line is None:
            sys.exit(f"preparing the initial weights failed:\n{proc.stderr[-3000:]}")
        for seed in range(args.seeds):  # interleaved: TRL seed 0, credo seed 0, TRL seed 1, ...
            for label, side in (("TRL", "trl"), ("credo", "credo")):
                runs[label].append(_child(args, side, line[6:], Path(tmp), seed))
                o = seed_outcome([Point(**p) for p in runs[label][-1]["points"]], args.threshold)
                print(f"  {label} seed {seed}: {'reached' if o['reached'] else 'not reached'} at step {o['step']}, "
                      f"{o['time_s']:.1f} s", flush=True)
    report(args, config, runs, before)


def report(args, config: dict, runs: dict[str, list[dict]], before: dict) -> Path:
    outcomes = {k: [seed_outcome([Point(**p) for p in run["points"]], args.threshold) for run in v]
                for k, v in runs.items()}
    starts = {run["points"][0]["acc"] for v in runs.values() for run in v}
    if max(starts) >= args.threshold:
        print(f"warning: the initial accuracy ({max(starts):.3f}) is already at the threshold: raise --threshold")
    if len(starts) > 1:
        print(f"warning: the step-0 accuracies differ between runs ({sorted(starts)}): not the same start")
    summary = paired_ratio(outcomes["TRL"], outcomes["credo"])
    for label in ("TRL", "credo"):
        _print_runs(label, outcomes[label], runs[label])
    for c in summary["censored"]:
        rel = f": ratio {c['relation']} {c['ratio_bound']:.2f}" if c["ratio_bound"] is not None else ""
        print(f"  seed {c['seed_index']} left out of the ratio: {c['censored']} censored{rel}")
    print(ratio_line(args.threshold, summary) + f"   ({summary['n']} seed(s) where both reached it; "
          "median of per-seed ratios, exact bootstrap over seeds)", flush=True)
    if 0 < summary["n"] < 5:
        print(f"warning: {summary['n']} paired seeds: the interval is close to the range of the ratios")
    path = Path(args.json) if args.json else Path("runs") / "bench" / (
        f"time-to-accuracy-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"name": ratio_line(args.threshold, summary), "threshold": args.threshold, "config": config,
            "summary": summary, "outcomes": outcomes, "runs": runs, "benchmark": vars(args),
            "meta": harness._meta(before, mode="time-to-accuracy", order="TRL, credo per seed")}
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"raw series: {path}")
    return path
