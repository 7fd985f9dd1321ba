"""Per-step time split and throughput of a `credo train` configuration, or an A/B comparison of two overrides.

Without --ab: runs the default config (or a preset plus overrides) in this process for a few RL steps after its
own warm start, then prints the median seconds per phase, each phase's share of the step, and tokens/s. The
baseline in the same run is the step itself: shares are fractions of the measured step time.

With --ab KEY=VALUE ...: A = the config with the --base overrides (none by default), B = the same config with the
--ab overrides, the positional overrides on both. The sides alternate in `--rounds` interleaved rounds of separate
processes (A, B, A, B, ...: benchmarks/harness.py `run_rounds`); each process is a short `credo train`-equivalent
run (its own warm start) of `--steps` RL steps that prints its per-step times (`timing_s/step` from metrics.jsonl)
as a JSON line, its first `--warmup-steps` left out. The result is median(B) / median(A) of the pooled step times
with a bootstrap 95% interval (independent samples), printed as `B / A step time: R x [lo, hi]` (below 1: B is
faster), beside the proxy (the median per step of `agent/prefill_tokens` for agent configs, else of
`perf/response_tokens`); then each side's median phase table and, for agent configs, each side's median
`agent/success_rate` and `agent/turns_mean`. The raw series and per-step metrics go to a JSON file (--json).
Shared overrides go before --ab / --base, or all of them after `--` (an option with values takes every value up
to the next option or `--`: the A / B override lists are printed first, check them).

    python benchmarks/step_time.py                       # default demo config, 20 steps
    python benchmarks/step_time.py --steps 40 train.prompts_per_step=32
    python benchmarks/step_time.py --config agent_maze --rounds 3 --steps 8 --warmup-steps 2 \\
        --base rollout.collector.kv_reuse=false --ab rollout.collector.kv_reuse=true -- warm_start.steps=20
    python benchmarks/step_time.py --rounds 4 --steps 12 --env-a MKL_CBWR=COMPATIBLE --env-b MKL_CBWR=AUTO

--env-a / --env-b NAME=VALUE ...: environment variables of one side's processes (alone or with --ab / --base), e.g.
MKL's reproducibility branch, which must be set before the process's first matrix product.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

PHASES = ("gen", "reward", "old_logprob", "ref", "adv", "update")
# per-step metrics each A/B process reports beside its step times (those present in its metrics.jsonl)
SIDE_KEYS = ("agent/prefill_tokens", "agent/success_rate", "agent/turns_mean", "agent/kv_reused_frac",
             "perf/response_tokens", "perf/tokens_per_s", "reward/mean")
BENCH = ["eval.every=0", "checkpoint.every=0", "checkpoint.save_final=false", "log.report=false",
         "log.tensorboard=false", "log.progress=false"]


def run_steps(config: str | None, steps: int, overrides: list[str], run_dir: Path):
    """Train `steps` RL steps of the config into run_dir; returns (config, the metrics rows of the RL steps)."""
    from credo.config import load_config
    from credo.recipes.rlvr import train
    from credo.tracking.metrics import read_metrics

    cfg = load_config(config, [f"train.steps={steps}", *BENCH, *overrides])
    run = train(cfg, run_dir=run_dir)
    return cfg, [r for r in read_metrics(run / "metrics.jsonl") if "timing_s/step" in r]


def medians(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, float]:
    """The median over rows of each key present in at least one row (a row without it counts as 0)."""
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys if any(k in r for r in rows)}


def phase_keys(rows: list[dict[str, Any]]) -> list[str]:
    return [f"timing_s/{p}" for p in PHASES if any(f"timing_s/{p}" in r for r in rows)]


def single(args) -> None:
    """One run in this process: the per-phase table with shares of the step."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, rows = run_steps(args.config, args.steps, args.overrides, Path(tmp) / "bench")
    rows = rows[args.warmup_steps:]
    if not rows:
        sys.exit("no steps measured; increase --steps")
    step = statistics.median(r["timing_s/step"] for r in rows)
    batch = cfg.train.prompts_per_step * cfg.rollout.group_size
    print(f"config: {args.config or 'default'} {' '.join(args.overrides)}".rstrip())
    print(f"batch: {cfg.train.prompts_per_step} prompts x {cfg.rollout.group_size} samples = {batch} sequences; "
          f"median over {len(rows)} steps")
    print(f"{'phase':<14}{'seconds':>10}{'share':>9}")
    for key, sec in medians(rows, phase_keys(rows)).items():
        print(f"{key.split('/')[1]:<14}{sec:>10.4f}{sec / step:>8.1%}")
    print(f"{'step':<14}{step:>10.4f}{1:>8.0%}")
    print(f"tokens/s (prompt+response, whole step): {statistics.median(r['perf/tokens_per_s'] for r in rows):,.0f}")
    print(f"response tokens/s during generation:    {statistics.median(r['perf/gen_tokens_per_s'] for r in rows):,.0f}")
    print(f"response tokens per step:               {statistics.median(r['perf/response_tokens'] for r in rows):,.0f}")
    print(f"mean reward {statistics.mean(r['reward/mean'] for r in rows):.3f}; rows left out of the update (all-zero "
          f"advantages) {statistics.mean(r.get('actor/skipped_rows_frac', 0.0) for r in rows):.0%}")


def child(args) -> None:
    """One A/B round of one side: print `TIMES {"times": [...], "rows": [...]}`, every RL step (warm-up too)."""
    _, rows = run_steps(args.config, args.steps, args.overrides, Path(args.child) / "bench")
    keys = ["timing_s/step", *phase_keys(rows), *SIDE_KEYS]
    print("TIMES " + json.dumps({"times": [r["timing_s/step"] for r in rows],
                                 "rows": [{k: r[k] for k in keys if k in r} for r in rows]}))


def side_rows(cmp, side: int, warmup: int) -> list[dict[str, Any]]:
    """One side's per-step metrics over its rounds, each process's first `warmup` steps left out."""
    return [r for out in cmp.raw["rounds_a" if side == 0 else "rounds_b"] for r in out["rows"][warmup:]]


def side_tables(cmp, warmup: int) -> list[str]:
    """Each side's median phase table (seconds, B / A), then its median agent metrics, as lines."""
    rows = [side_rows(cmp, s, warmup) for s in (0, 1)]
    keys = list(dict.fromkeys(phase_keys(rows[0]) + phase_keys(rows[1]) + ["timing_s/step"]))
    med = [medians(r, keys) for r in rows]
    lines = [f"{'phase':<14}{'A (s)':>10}{'B (s)':>10}{'B / A':>8}   (median per step; A = {cmp.labels[0]}, "
             f"B = {cmp.labels[1]})"]
    for k in keys:
        a, b = med[0].get(k, 0.0), med[1].get(k, 0.0)
        lines.append(f"{k.split('/')[1]:<14}{a:>10.4f}{b:>10.4f}{(f'{b / a:.2f}' if a else '-'):>8}")
    extra = [k for k in ("agent/success_rate", "agent/turns_mean", "agent/kv_reused_frac", "reward/mean")
             if any(k in r for r in rows[0] + rows[1])]
    for k in extra:
        m = [medians(r, [k]).get(k) for r in rows]
        lines.append(f"{k:<22} median per step: " + ", ".join(
            f"{side} {'-' if v is None else f'{v:.4g}'}" for side, v in zip("AB", m)))
    return lines


def proxy(cmp, warmup: int):
    """agent/prefill_tokens (agent configs) or perf/response_tokens: the median per step of each side."""
    import harness

    rows = [side_rows(cmp, s, warmup) for s in (0, 1)]
    for key in ("agent/prefill_tokens", "perf/response_tokens"):
        if all(any(key in r for r in side) for side in rows):
            a, b = (medians(side, [key])[key] for side in rows)
            return harness.Proxy(f"{key} (median per step)", a, b)
    return None


def _warn_one_sided(base: list[str], ab: list[str]) -> None:
    ka, kb = ({o.split("=", 1)[0] for o in side} for side in (base, ab))
    if base and ka != kb:
        print(f"note: keys set on one side only: A {sorted(ka - kb)}, B {sorted(kb - ka)}; a shared override "
              "goes before --ab / --base or after `--`", flush=True)


def ab(args) -> None:
    import harness  # benchmarks/ (this script's directory) is on sys.path

    labels = (" ".join(args.env_a + args.base) or "base config", " ".join(args.env_b + args.ab))
    print(f"config: {args.config or 'default'}; both sides: {' '.join(args.overrides) or '-'}\n  A: {labels[0]}\n"
          f"  B: {labels[1]}\n{args.rounds} rounds of {args.steps} RL steps per side ({args.warmup_steps} warm-up "
          "steps per process left out)", flush=True)
    _warn_one_sided(args.base, args.ab)
    with tempfile.TemporaryDirectory() as tmp:
        def cmd(overrides: list[str], name: str, env: list[str]):
            def argv(i: int) -> list[str]:  # each round its own run directory
                out = tempfile.mkdtemp(dir=tmp, prefix=f"{name}-{i}-")
                return [*(["env", *env] if env else []), sys.executable, __file__, "--child", out, "--steps", str(args.steps),
                        *(["--config", args.config] if args.config else []), "--", *args.overrides, *overrides]
            return argv

        try:
            cmp = harness.run_rounds(cmd(args.base, "a", args.env_a), cmd(args.ab, "b", args.env_b), rounds=args.rounds,
                                     warmup=args.warmup_steps, order=args.order, seed=args.seed, marker="TIMES ",
                                     timeout=args.timeout, name="B / A step time", labels=labels)
        except (RuntimeError, ValueError) as err:
            sys.exit(f"step time A/B: {err}")
    cmp.proxy = proxy(cmp, args.warmup_steps)
    cmp.meta["benchmark"] = vars(args)
    harness.report(cmp, Path(args.json) if args.json else None)
    print("\n".join(side_tables(cmp, args.warmup_steps)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None)
    ap.add_argument("--steps", type=int, default=20, help="RL steps (per process with --ab)")
    ap.add_argument("--warmup-steps", type=int, default=3, help="RL steps (of each process) excluded from the medians")
    ap.add_argument("--ab", nargs="+", metavar="KEY=VALUE", help="A/B mode: B's overrides (A runs without them)")
    ap.add_argument("--base", nargs="+", default=[], metavar="KEY=VALUE", help="A/B mode: A's own overrides")
    ap.add_argument("--env-a", nargs="+", default=[], metavar="NAME=VALUE", help="A/B mode: A's environment")
    ap.add_argument("--env-b", nargs="+", default=[], metavar="NAME=VALUE", help="A/B mode: B's environment")
    ap.add_argument("--rounds", type=int, default=3, help="A/B mode: interleaved rounds, one process per side each")
    ap.add_argument("--order", choices=("alternate", "balanced"), default="alternate",
                    help="A/B mode: A B A B ..., or each round pair in a seeded random order")
    ap.add_argument("--seed", type=int, default=0, help="A/B mode: order and bootstrap seed")
    ap.add_argument("--json", help="A/B mode: raw series and metadata (default: runs/bench/<name>-<time>.json)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="A/B mode: seconds per process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="config overrides (both sides with --ab), e.g. warm_start.steps=20")
    args = ap.parse_args()
    if args.child:
        child(args)
    elif args.ab or args.env_a or args.env_b:
        args.ab = args.ab or []
        ab(args)
    elif args.base:
        ap.error("--base needs --ab (the B side's overrides)")
    else:
        single(args)


if __name__ == "__main__":
    main()
