"""``credo template check MODEL_OR_TEMPLATE [--tokenizer DIR] [--json]``: prove or refute a chat template's
extension property (credo.tools.template_check, docs/templates.md). Exit 0 when it holds, 1 when refuted (the first
divergence and its cause are printed), 2 for bad input."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from credo.tools.template_check import CAUSES, byte_tokenizer, check

EXIT_HOLDS, EXIT_REFUTED, EXIT_BAD_INPUT = 0, 1, 2
BYTE_NOTE = ("tokenizer: byte-level fallback (each UTF-8 byte is one token, the template's bos / eos one token "
             "each), so the token-level verdict is the text-level one; give --tokenizer DIR for the model's tokens")
_TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "chat_template*", "*.jinja", "vocab*", "merges.txt",
                    "*.model", "config.json")


def add_commands(sub) -> None:
    p = sub.add_parser("template", help="chat template checks (docs/templates.md)")
    tsub = p.add_subparsers(dest="template_command", required=True)
    c = tsub.add_parser("check", help="prove or refute that each turn's tokens are a prefix of the next render "
                        "(exit 0 holds, 1 refuted, 2 bad input)")
    c.add_argument("target", metavar="MODEL_OR_TEMPLATE",
                   help="a model / tokenizer directory, a hub id in the local hub cache, or a .jinja file")
    c.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="with a .jinja file: the tokenizer directory (default: a byte-level fallback)")
    c.add_argument("--seed", type=int, default=0, help="seed of the conversations (default 0)")
    c.add_argument("--json", action="store_true", help="print the verdict as JSON")
    c.set_defaults(func=cmd_check)


class BadInput(ValueError):
    """MODEL_OR_TEMPLATE (or --tokenizer) cannot be loaded."""


def _auto_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - any loading failure is the input's
        raise BadInput(f"{path}: no tokenizer could be loaded ({type(exc).__name__}: {str(exc)[:200]})") from None


def load(target: str, tokenizer_dir: str | None) -> tuple[object, str | None, str]:
    """(tokenizer, chat template or None for the tokenizer's own, a note on the tokenizer used)."""
    from credo.config.hub_ref import parse_hub_id

    path = Path(target).expanduser()
    if path.suffix == ".jinja" or path.is_file():
        if not path.is_file():
            raise BadInput(f"{target}: no such template file")
        template = path.read_text(encoding="utf-8")
        if tokenizer_dir:
            return _auto_tokenizer(Path(tokenizer_dir).expanduser()), template, f"tokenizer: {tokenizer_dir}"
        return byte_tokenizer(template), template, BYTE_NOTE
    if tokenizer_dir:
        raise BadInput("--tokenizer is for a .jinja template; a model directory or hub id brings its own tokenizer")
    if path.is_dir():
        return _auto_tokenizer(path), None, f"tokenizer: {path}"
    if parse_hub_id(target) is not None:
        from credo.models.hub import cached_model_path, hub_cache_dir

        snap = cached_model_path(target, allow_patterns=_TOKENIZER_FILES)
        if snap is None:
            raise BadInput(f"{target}: not in the hub cache {hub_cache_dir()} (no hub is reached); fetch its "
                           "tokenizer files first or give a local directory")
        return _auto_tokenizer(snap), None, f"tokenizer: {target} ({snap})"
    raise BadInput(f"{target}: neither a .jinja file, a directory nor a hub id")


def cmd_check(args: argparse.Namespace) -> int:
    try:
        tokenizer, template, note = load(args.target, args.tokenizer)
        verdict = check(tokenizer, template, seed=args.seed)
    except (BadInput, ValueError) as exc:
        print(f"credo template check: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps({**verdict.to_dict(), "note": note}, ensure_ascii=False, indent=2))
    else:
        print(note)
        print(verdict.summary())
        for conv, result in verdict.results.items():
            print(f"  {conv}: {result}")
        if verdict.divergence is not None:
            print(f"cause {verdict.cause}: {CAUSES[verdict.cause]}")
        for line in verdict.skipped:
            print(f"  not rendered: {line}")
    return EXIT_HOLDS if verdict.holds else EXIT_REFUTED
