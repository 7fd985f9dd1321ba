"""Grounding spans and the perturbations VEPO applies to them (``docs/algorithms/vepo.md``).

A task marks the part of its prompt that an answer must be grounded in as character spans of the prompt text,
``Example.meta["grounding"] = [(start, end), ...]`` (half-open): the string to reverse (``reversal``), the two
operands (``addition``), the numbers and the target (``countdown``). A JSONL / Parquet row may carry the same
field, ``"grounding": [[start, end], ...]``, relative to its prompt field (it lands in ``meta``).

A perturbation is a function

    perturb(text: str, spans: list[tuple[int, int]], rng: random.Random, **args) -> str

that corrupts the characters inside ``spans`` and leaves every other character where it was. Built-ins:
``shuffle`` (permute the span characters among the span positions), ``random`` (each span character replaced
by a different random character of its class: digit, lowercase, uppercase) and ``mask`` (each span character
replaced by a filler). Any ``module:function`` with the same signature is accepted. The rng is seeded from
(run seed, step, row) (:func:`perturbation_rng`), so a rerun perturbs identically.

Other modalities plug into the same hook: for a vision-language model the grounding input is the image, the
"spans" are its regions (or the whole image), and the perturbation returns noised pixels
(``perturb(pixels, regions, rng, std=...) -> pixels``, :mod:`credo.methods.vepo.image`). VEPO's forward
(:mod:`credo.methods.vepo.select`) only needs a second batch whose grounding input is perturbed and whose response
tokens are unchanged.
"""
from __future__ import annotations

import importlib
import inspect
import random
import string
from typing import Any, Callable

from credo.registry import Registry, UnknownName

Spans = list[tuple[int, int]]
Perturbation = Callable[..., str]

PERTURBATIONS: Registry[Perturbation] = Registry("perturbation")
CLASSES = (string.digits, string.ascii_lowercase, string.ascii_uppercase)


def register_perturbation(name: str) -> Callable[[Perturbation], Perturbation]:
    return PERTURBATIONS.register(name)


def lookup_callable(table: Registry[Callable], name: str) -> Callable:
    """``table.get(name)``, or ``module:function`` imported; an unknown or non-callable name is a KeyError naming
    the table's kind and its entries (shared by the text and image perturbation registries)."""
    kind = table.kind
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise KeyError(f"{kind} {name!r}: cannot import it ({exc})") from None
        if not callable(fn):
            raise KeyError(f"{kind} {name!r} is not callable")
        return fn
    try:
        return table.get(name)
    except UnknownName as exc:
        raise UnknownName(f"{exc}; or module:function") from None


def get_perturbation(name: str) -> Perturbation:
    """A registered perturbation, or ``module:function``; an unknown name is a KeyError."""
    return lookup_callable(PERTURBATIONS, name)


def check_perturbation_args(name: str, args: dict[str, Any]) -> None:
    """TypeError when ``args`` are not keyword parameters of perturbation ``name``."""
    sig = inspect.signature(get_perturbation(name))
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    known = list(sig.parameters)[3:]
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise TypeError(f"perturbation {name!r} has no parameter(s) {unknown}; it takes: {', '.join(known) or 'none'}")


def perturbation_rng(seed: int, step: int, row: int) -> random.Random:
    """The rng of one row's perturbation (string seeds hash with SHA-512: stable across processes)."""
    return random.Random(f"credo/vepo/{seed}/{step}/{row}")


def span_positions(spans: Spans) -> list[int]:
    """Sorted, distinct character positions covered by ``spans``."""
    return sorted({i for s, e in spans for i in range(s, e)})


def _replace(text: str, positions: list[int], chars: list[str]) -> str:
    out = list(text)
    for i, c in zip(positions, chars):
        out[i] = c
    return "".join(out)


@register_perturbation("shuffle")
def shuffle(text: str, spans: Spans, rng: random.Random, *, tries: int = 10) -> str:
    """Permute the characters at the span positions among those positions (all spans pooled; the multiset of
    span characters is kept). Retries up to ``tries`` times for a permutation that changes the text."""
    pos = span_positions(spans)
    chars = [text[i] for i in pos]
    out = text
    for _ in range(max(tries, 1)):
        perm = chars[:]
        rng.shuffle(perm)
        out = _replace(text, pos, perm)
        if out != text or len(set(chars)) < 2:
            break
    return out


def _other_of_class(c: str, rng: random.Random, alphabet: str | None) -> str:
    pool = alphabet if alphabet is not None else next((cls for cls in CLASSES if c in cls), "")
    choices = [x for x in pool if x != c]
    return rng.choice(choices) if choices else c


@register_perturbation("random")
def random_chars(text: str, spans: Spans, rng: random.Random, *, alphabet: str | None = None) -> str:
    """Replace each span character by a different random character of its class (digits, lowercase,
    uppercase; other characters are kept), or of ``alphabet`` when given."""
    pos = span_positions(spans)
    return _replace(text, pos, [_other_of_class(text[i], rng, alphabet) for i in pos])


@register_perturbation("mask")
def mask(text: str, spans: Spans, rng: random.Random, *, fill: str = "_") -> str:
    """Replace each span character by ``fill`` (one character)."""
    if len(fill) != 1:
        raise ValueError(f"mask: fill must be one character, got {fill!r}")
    pos = span_positions(spans)
    return _replace(text, pos, [fill] * len(pos))


def example_spans(meta: dict[str, Any], *, offset: int, text_len: int, uid: str = "") -> Spans:
    """The grounding spans of an example, shifted by ``offset`` (where the task's prompt starts inside the
    formatted prompt). A missing or malformed field is a ValueError that names the example."""
    raw = meta.get("grounding")
    who = f"example {uid!r}" if uid else "an example"
    if raw is None:
        raise ValueError(f"VEPO: {who} has no grounding span (Example.meta['grounding']); built-in tasks mark it, "
                         "file rows need a 'grounding': [[start, end], ...] field (character offsets in the prompt)")
    try:
        spans = [(int(s) + offset, int(e) + offset) for s, e in raw]
    except (TypeError, ValueError):
        raise ValueError(f"VEPO: {who}: grounding must be a list of [start, end] pairs, got {raw!r}") from None
    for s, e in spans:
        if not offset <= s <= e <= text_len:
            raise ValueError(f"VEPO: {who}: grounding span [{s - offset}, {e - offset}) does not fit in the "
                             f"prompt (offset {offset}, {text_len} characters)")
    return spans


def prompt_offset(template: str = "{prompt}", *, chat: bool = False, tokenizer: Any = None) -> int:
    """Where the task's own prompt text starts in the prompt the model sees (``task.prompt_template``, and the
    tokenizer's chat template when ``chat``); the first ``{prompt}`` of the template."""
    sentinel = "\x00VEPO\x00"
    text = template.format(prompt=sentinel)  # as credo.data.source.format_prompts
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    if sentinel not in text:
        raise ValueError(f"VEPO: cannot locate the prompt inside the template {template!r}")
    return text.index(sentinel)
