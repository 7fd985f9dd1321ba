"""Median GRPO step time: credo vs TRL's GRPOTrainer, same model, prompts, group size, lengths, one update per step.

Both run on the CPU from the same initial weights (a Hugging Face directory written first), the same prompt pool,
the same reward, group size G, P prompts per step, at most T new tokens at temperature 1, no KL term, and one
optimizer step per rollout batch (TRL: num_iterations=1, steps_per_generation=1; credo: ppo_epochs=1, one
mini-batch). Each framework runs in its own subprocesses with the same torch thread count; a step is the whole
iteration (generation, reward, log-probs, update), timed by TRL's step callbacks and by credo's `timing_s/step`.
The two frameworks alternate in `--rounds` short rounds (TRL, credo, TRL, credo, ...: benchmarks/harness.py), each
round a fresh process of `--steps` steps whose first `--warmup` are left out; the result is the ratio of the median
step times, credo / TRL, with a bootstrap 95% interval over the pooled steps (independent samples), printed as
`credo / TRL step time: R x [lo, hi]`; the raw series go to a JSON file. TRL is an optional extra:
pip install -e '.[bench]'.

The initial policies solve some prompts and not others, as an RL run starts: the demo's model after its SFT warm
start, SmolLM2 on one-digit addition. Each framework's mean reward is printed, and for credo the share of rows
left out of the update because all their advantages are zero (exact for GRPO without KL: see
docs/performance.md); `--ablation` also compares credo with each of its step-time features turned off in turn
against credo with all on.

    python benchmarks/vs_trl.py                     # the demo's tiny model on string reversal
    python benchmarks/vs_trl.py --model smollm2 --chat --max-new-tokens 48 --prompts 4 --rounds 3 --steps 3 --warmup 1
        # SmolLM2-135M-Instruct asked one-digit sums through its chat template (credo model prepare smollm2)
    python benchmarks/vs_trl.py --time-to-accuracy --seeds 3
        # wall time to a held-out greedy accuracy, SmolLM2 on one-digit sums, per seed (benchmarks/vs_trl_tta.py)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASKS = {"tiny": ("reversal", {}), "smollm2": ("addition", {"digits": 1})}
# credo's step-time features that TRL lacks, each with the override that turns it off (--ablation)
ABLATIONS = {"skip_zero_advantage": "train.skip_zero_advantage=false", "share_prompt": "train.share_prompt=false",
             "lean_decode": "rollout.lean_decode=false", "pack_responses": "train.pack_responses=false"}
CHAT_TEMPLATE = "What is {prompt}? Reply with the number only."  # --chat: SmolLM2 asked as an instruct model


def _examples(task: str, params: dict, n: int):
    from credo.data.tasks import build_splits, get_task

    train, _ = build_splits(get_task(task, **params), train_size=n, eval_size=8, seed=0)
    return train


def prepare(args, workdir: Path) -> Path:
    """The shared initial weights: the demo's tiny model after the demo's SFT warm start (a policy that solves
    some prompts, as RL starts from: a freshly initialised model scores 0 everywhere and every advantage is 0),
    or the prepared SmolLM2 directory."""
    if args.model == "smollm2":
        from credo.models.smollm2 import prepare_smollm2

        return prepare_smollm2()
    import torch

    from credo.config import load_config
    from credo.data.source import load_task_data
    from credo.models import build_model, save_model
    from credo.train.sft import run_sft

    torch.set_num_threads(args.threads)
    cfg = load_config(None, [])
    model, tok = build_model(cfg.model, seed=0)
    data = load_task_data(cfg.task, seed=cfg.seed)
    w = cfg.warm_start
    run_sft(model, tok, data.train, data.demonstration, steps=w.steps, batch_size=w.batch_size, lr=w.lr,
            warmup_steps=w.warmup_steps, seed=cfg.seed)
    save_model(model, tok, workdir / "init")
    return workdir / "init"


def run_trl(args, model_dir: str, out: Path) -> dict[str, list[float]]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from credo.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(model_dir)
    tok.padding_side = "left"
    task, params = TASKS[args.model]
    rows = _examples(task, params, args.prompts * (args.steps + 1))
    if args.chat:  # conversational prompts: TRL applies the tokenizer's chat template, as credo does
        data = Dataset.from_list([{"prompt": [{"role": "user", "content": CHAT_TEMPLATE.format(prompt=ex.prompt)}],
                                   "answer": ex.answer} for ex in rows])
    else:
        data = Dataset.from_list([{"prompt": ex.prompt, "answer": ex.answer} for ex in rows])

    def reward(completions, answer, **_):
        from credo.rewards.verifiers import number
        from credo.types import Example

        if args.chat:  # same verifier as credo's: the last number of the reply
            return [number(c[0]["content"], Example("", a, "")).score for c, a in zip(completions, answer)]
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    times: list[float] = []
    rewards: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, *a, logs=None, **k):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, use_vllm=False, gradient_checkpointing=False,
        per_device_train_batch_size=args.prompts * args.group, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=args.group, max_completion_length=args.max_new_tokens, num_iterations=1, beta=0.0,
        temperature=1.0, top_p=1.0, learning_rate=1e-5, loss_type="dapo", max_steps=args.steps, logging_steps=1,
        save_strategy="no", report_to="none", seed=0, disable_tqdm=True, dataloader_num_workers=0,
        shuffle_dataset=False)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[StepTimer()])
    trainer.train()
    return {"times": times, "reward": rewards}


def run_credo(args, model_dir: str, out: Path) -> dict[str, list[float]]:
    from credo.config import load_config
    from credo.recipes.rlvr import train
    from credo.tracking.metrics import read_metrics

    task, params = TASKS[args.model]
    overrides = [
        f"model.path={model_dir}", "warm_start.enabled=false", f"task.name={task}",
        f"task.params={json.dumps(params)}", f"train.steps={args.steps}", f"train.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0",
        "algo.kl_coef=0", "train.ppo_epochs=1", "train.lr=1e-5", "reward.name=exact_match", "eval.every=0",
        "eval.size=1", "eval.k=1", "task.eval_size=8", f"task.train_size={args.prompts * (args.steps + 1)}",
        "task.seed=0", "checkpoint.every=0", "checkpoint.save_final=false", "log.report=false",
        "log.tensorboard=false", "log.progress=false", f"train.threads={args.threads}", *args.credo,
    ]
    if args.chat:
        overrides += ["task.chat_template=true", f"task.prompt_template={CHAT_TEMPLATE}", "reward.name=number"]
    run = train(load_config(None, overrides), run_dir=out / "credo")
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "timing_s/step" in r]
    return {"times": [r["timing_s/step"] for r in rows], "reward": [r["reward/mean"] for r in rows],
            "skipped": [r.get("actor/skipped_rows_frac", 0.0) for r in rows]}


def _child_cmd(args, name: str, model_dir: str, out: Path, overrides: list[str]):
    """argv of one round of one side, as a function of the round index (each round its own output folder)."""
    def argv(i: int) -> list[str]:
        run_out = tempfile.mkdtemp(dir=out, prefix=f"{name}-{i}-")  # never shared: credo appends to metrics
        env = [*args.trl_env] if name == "trl" and args.trl_env else []  # `env NAME=VALUE ... python ...`
        return [*(["env", *env] if env else []), sys.executable, __file__, "--model", args.model, "--steps",
                str(args.steps), "--prompts",
                str(args.prompts), "--group", str(args.group), "--max-new-tokens", str(args.max_new_tokens),
                "--threads", str(args.threads), *(["--chat"] if args.chat else []), "--only", name, "--model-dir",
                model_dir, "--out", run_out] + (["--credo", *overrides] if overrides else [])
    return argv


def _summary(cmp, side: int) -> str:
    """Mean reward (and credo's share of skipped rows) over one side's rounds."""
    rounds = cmp.raw["rounds_a" if side == 0 else "rounds_b"]
    rewards = [r for out in rounds for r in out.get("reward", [])]
    text = f"{cmp.labels[side]}: mean reward {statistics.mean(rewards):.3f}" if rewards else cmp.labels[side]
    skipped = [x for out in rounds for x in out.get("skipped", [])]
    if skipped:
        text += f"; rows left out of the update (all-zero advantages) {statistics.mean(skipped):.0%}"
    return text


def _pairs(args) -> list[tuple[str, tuple[str, str], tuple[str, list[str]], tuple[str, list[str]]]]:
    """(name, labels, side A, side B): A = TRL (reference), B = credo; then, with --ablation, A = credo and
    B = credo with one feature off. A side is (child --only name, credo overrides)."""
    pairs = [("credo / TRL step time", ("TRL", "credo"), ("trl", []), ("credo", args.credo))]
    if args.ablation:
        pairs += [(f"credo, {name} off / credo step time", ("credo", f"credo, {name} off"),
                   ("credo", args.credo), ("credo", [*args.credo, override])) for name, override in ABLATIONS.items()]
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=tuple(TASKS), default="tiny")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds: one process per side per round")
    ap.add_argument("--steps", type=int, default=7, help="steps per process (round)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each process left out")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (P)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: 12 (tiny), 24 (smollm2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--json", help="raw series and metadata (default: runs/bench/<name>-<time>.json)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    ap.add_argument("--chat", action="store_true", help="instruct-style prompts through the chat template, "
                    "`number` reward (short answers, a few long ones: ragged batches)")
    ap.add_argument("--only", choices=("prepare", "trl", "credo"), help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--credo", nargs="*", default=[], help="extra credo overrides, e.g. train.pack=true")
    ap.add_argument("--trl-env", nargs="+", default=[], metavar="NAME=VALUE",
                    help="environment of TRL's processes, e.g. the glibc allocator setting credo makes itself: "
                    "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647")
    ap.add_argument("--ablation", action="store_true", help="also compare credo with each of its step-time "
                    "features turned off in turn (" + ", ".join(ABLATIONS) + ") against credo with all on")
    import vs_trl_tta  # benchmarks/ (this script's directory) is on sys.path

    vs_trl_tta.add_arguments(ap)
    args = ap.parse_args()
    if args.time_to_accuracy:  # time to held-out accuracy instead of step times (benchmarks/vs_trl_tta.py)
        vs_trl_tta.main(args)
        return
    args.max_new_tokens = args.max_new_tokens or (12 if args.model == "tiny" else 24)
    if args.only == "prepare":
        print("MODEL " + str(prepare(args, Path(args.out))))
        return
    if args.only:
        fn = run_trl if args.only == "trl" else run_credo
        print("TIMES " + json.dumps(fn(args, args.model_dir, Path(args.out))))
        return
    import harness  # benchmarks/ (this script's directory) is on sys.path

    with tempfile.TemporaryDirectory() as tmp:
        # every torch computation runs in a child process: a parent that has run torch itself (the warm start)
        # slows its children down (measured 0.087 s -> 0.113 s per credo step of the tiny model)
        proc = subprocess.run([sys.executable, __file__, "--model", args.model, "--threads", str(args.threads),
                               "--only", "prepare", "--out", tmp], capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("MODEL ")), None)
        if proc.returncode or line is None:
            sys.exit(f"preparing the initial weights failed:\n{proc.stderr[-3000:]}")
        model_dir, out = line[6:], Path(tmp)
        print(f"model {args.model}; {args.prompts} prompts x {args.group} samples, <= {args.max_new_tokens} new "
              f"tokens, {args.threads} threads{', chat prompts' if args.chat else ''}; {args.rounds} rounds of "
              f"{args.steps} steps per side ({args.warmup} warm-up steps per process left out)", flush=True)
        pairs = _pairs(args)
        for k, (name, labels, (side_a, over_a), (side_b, over_b)) in enumerate(pairs):
            try:
                cmp = harness.run_rounds(
                    _child_cmd(args, side_a, model_dir, out, over_a), _child_cmd(args, side_b, model_dir, out, over_b),
                    rounds=args.rounds, warmup=args.warmup, marker="TIMES ", timeout=args.timeout, name=name,
                    labels=labels, seed=args.seed)
            except (RuntimeError, ValueError) as err:
                sys.exit(f"{name}: {err}")
            cmp.meta["benchmark"] = vars(args)
            print(f"{_summary(cmp, 0)}; {_summary(cmp, 1)}")
            path = Path(args.json) if args.json else None  # ablations: NAME-1.json, NAME-2.json, ...
            harness.report(cmp, path.with_stem(f"{path.stem}-{k}") if path and k else path)


if __name__ == "__main__":
    main()
