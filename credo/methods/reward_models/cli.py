"""``credo rm train`` (Bradley-Terry ORM, CRM, BiRM: :mod:`credo.methods.reward_models.recipe`, with its own config
root :class:`~credo.methods.reward_models.config.RmRunConfig`) and ``credo rm serve`` (a trained model over HTTP,
:mod:`credo.rewards.rm_server`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from credo.recipes.cli_common import config_args, no_half_made_run_dir, run_dir_args, target_run_dir
from credo.config import ConfigError, load_config
from credo.recipes.preflight import check_device, preflight
from credo.http_server import add_limit_args, limits_from_args


def add_commands(sub) -> None:
    p = sub.add_parser("rm", help="reward models: train an outcome reward model (Bradley-Terry) or CRM's pair")
    rm_sub = p.add_subparsers(dest="rm_command", required=True, metavar="ACTION")
    q = rm_sub.add_parser("train", help="train on rm.train_file pairs or pairs generated from task (rm.* settings)")
    config_args(q)
    run_dir_args(q, "output_dir/<task>-rm-<method>-<time>")
    q.set_defaults(func=cmd_rm_train)
    q = rm_sub.add_parser("serve", help="serve a trained reward model over HTTP (POST /score) for reward.kwargs.url")
    q.add_argument("path", help="a saved reward model directory (RUN_DIR/reward_model)")
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--port", type=int, default=8090)
    q.add_argument("--pooling", choices=("last", "mean"), default="last", help="as the model was trained (rm.pooling)")
    q.add_argument("--device", default="cpu")
    q.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (default: $CREDO_RM_TOKEN; "
                   "none = no authentication)")
    q.add_argument("--max-request-bytes", type=int, default=16 * 2**20, help="larger bodies get 413 (default 16 MiB)")
    q.add_argument("--max-pairs", type=int, default=4096, help="more (prompt, response) pairs per request get 413")
    q.add_argument("--max-tokens", type=int, default=None, help="prompt + response tokens scored, cut from the left "
                   "of the prompt (default: the model's context)")
    q.add_argument("--batch-size", type=int, default=16, help="sequences per forward; other requests are served "
                   "between forwards")
    add_limit_args(q, max_request_mb=None)  # connections, heads, body time (credo.http_server); the cap is above
    q.set_defaults(func=cmd_rm_serve)


def cmd_rm_serve(args: argparse.Namespace) -> int:
    from credo.rewards.reward_model import serve
    from credo.rewards.rm_server import ServeLimits

    try:
        limits = ServeLimits(max_request_bytes=args.max_request_bytes, max_pairs=args.max_pairs,
                             max_tokens=args.max_tokens, batch_size=args.batch_size)
        server_limits = limits_from_args(args, max_body_bytes=limits.max_request_bytes)
    except ValueError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith("rm serve:") else f"rm serve: {msg}") from None
    check_device("--device", args.device)
    print(f"reward model {args.path} on http://{args.host}:{args.port} (POST /score)", flush=True)
    serve(args.path, host=args.host, port=args.port, pooling=args.pooling, device=args.device, limits=limits,
          token=args.token, server_limits=server_limits)
    return 0


def cmd_rm_train(args: argparse.Namespace) -> int:
    from credo.methods.reward_models.config import RmRunConfig
    from credo.methods.reward_models.recipe import rm_train

    cfg = load_config(args.config, args.overrides, root=RmRunConfig)
    preflight(cfg, run_dir=Path(args.run_dir) if args.run_dir else None, rl=False,
              files=(("rm.train_file", cfg.rm.train_file), ("rm.eval_file", cfg.rm.eval_file)))
    with no_half_made_run_dir(target_run_dir(cfg, args.run_dir, f"{cfg.task.name}-rm-{cfg.rm.method}")):
        run_dir = rm_train(cfg, run_dir=Path(args.run_dir) if args.run_dir else None, overwrite=args.overwrite)
    print(f"run directory: {run_dir}")
    print((run_dir / "summary.json").read_text().strip())
    return 0
