"""Trainer / engine parity, measured (``credo parity``; docs/parity.md).

Over a seeded batch of the task's prompts (``rows`` rows, ``rollout.group_size`` per prompt), the engine (credo's
HF engine, or vLLM) samples responses and returns its behaviour log-probs; the trainer's forward
(:func:`credo.train.forward.policy_logprobs`, the function the update computes ``logprobs`` with) recomputes them
under each of its layouts. Per comparison: per-token |trainer - engine| (mean, max, p99) and the share of tokens
whose ratio exp(trainer - engine) leaves [0.9, 1.1] (verl issue #6280's measure).

Trainer variants (all on the engine's batch, all real code paths): ``padded`` (many rows, padded), ``rows_1``
(each row a micro-batch of one, trimmed), ``packed`` (train.pack), ``shared_prompt`` (train.share_prompt, responses
padded), ``shared_prompt_packed`` (train.share_prompt + train.pack_responses), ``full_logits``
(train.logprob_chunk_size=0), ``small_chunks`` (chunk size 3), ``config`` (the forward the given configuration
runs: ForwardOptions.of(cfg), with train.mixed_precision's autocast).

Engine variants, each against the trainer's ``padded`` forward of the engine's own tokens: ``rows_1`` (each row
decoded alone), HF: ``generic_decode`` (the lean decode off), ``kv_reuse_on`` / ``kv_reuse_off`` (a second turn on
the first turn's KV sessions or fully prefilled, credo.rollout.kv_reuse); vLLM: ``prefix_cache_warm`` /
``prefix_cache_cold`` (a second turn whose history, the prompt repeated to :data:`HISTORY_TOKENS` tokens and its
first turn, is in vLLM's prefix cache, or the same after a reset of the cache).

Layer localisation: :mod:`credo.inspect.parity_layers`.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from credo.inspect.parity_layers import LAYER_TOL, engine_layer_states, layer_names, localise, trainer_layer_states
from credo.types import Example, RewardResult, SamplingParams, Trajectory

BOUNDS = (0.9, 1.1)  # the ratio band of verl issue #6280
SECOND_TURN = "\nnext: "
# vLLM's prefix cache keeps whole KV blocks (128 tokens on its CPU build, 16 by default on CUDA): the prefix-cache
# variants' first turn is the prompt repeated to this many tokens, so its blocks can be read back
HISTORY_TOKENS = 160  # the observation appended before a second turn (engine KV reuse / prefix-cache variants)


@dataclass
class ParityOptions:
    engine: str = "hf"  # hf | vllm
    rows: int = 16
    seed: int = 0
    layer_tol: float = LAYER_TOL
    layers: bool = True  # localise diverging layers


@dataclass
class EngineRun:
    """One engine variant's rows: the collated batch (its ``rollout_logprobs`` are the engine's)."""

    name: str
    description: str
    batch: Any
    info: dict = field(default_factory=dict)


# ---------------------------------------------------------------- statistics


def token_stats(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor,
                bounds: tuple[float, float] = BOUNDS) -> dict:
    """Per-token |trainer - engine| over ``mask`` (B, T): tokens, mean, max, p99, and the share of tokens whose
    ratio exp(trainer - engine) leaves ``bounds`` (tokens where the engine gave no log-prob are left out)."""
    keep = mask.bool() & torch.isfinite(engine) & torch.isfinite(trainer)
    d = (trainer.double() - engine.double())[keep]
    if d.numel() == 0:
        return {"tokens": 0, "mean_abs": None, "max_abs": None, "p99_abs": None, "out_of_range": None}
    a, ratio = d.abs(), d.exp()
    return {"tokens": int(d.numel()), "mean_abs": float(a.mean()), "max_abs": float(a.max()),
            "p99_abs": float(torch.quantile(a, 0.99)),
            "out_of_range": float(((ratio < bounds[0]) | (ratio > bounds[1])).double().mean())}


# ---------------------------------------------------------------- trainer variants


@dataclass(frozen=True)
class TrainerVariant:
    name: str
    description: str
    opts: Any  # ForwardOptions
    one_row: bool = False
    head_only: bool = False  # differs from padded only in the output head (same backbone forward)
    needs_shared: bool = False  # only differs from padded when two rows share a prompt


def trainer_variants(cfg) -> list[TrainerVariant]:
    from credo.train.forward import ForwardOptions

    base = ForwardOptions(chunk_size=None, pack=False, share_prompt=False, pack_responses=False)
    rt = cfg.train.pack_row_tokens
    rep = dataclasses.replace
    return [
        TrainerVariant("padded", "many rows, padded, chunked log-probs (the reference layout)", base),
        TrainerVariant("rows_1", "each row alone (a micro-batch of one, trimmed)", base, one_row=True),
        TrainerVariant("packed", "train.pack: rows packed without padding", rep(base, pack=True, row_tokens=rt)),
        TrainerVariant("shared_prompt", "train.share_prompt: each prompt run once, responses padded",
                       rep(base, share_prompt=True), needs_shared=True),
        TrainerVariant("shared_prompt_packed", "train.share_prompt + train.pack_responses",
                       rep(base, share_prompt=True, pack_responses=True, row_tokens=rt), needs_shared=True),
        TrainerVariant("full_logits", "train.logprob_chunk_size=0: the full (B, T, V) logits",
                       rep(base, chunk_size=0), head_only=True),
        TrainerVariant("small_chunks", "train.logprob_chunk_size=3", rep(base, chunk_size=3), head_only=True),
        TrainerVariant("config", "the configuration's own forward (ForwardOptions.of(cfg))", ForwardOptions.of(cfg)),
    ]


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module, batch, variant: TrainerVariant) -> torch.Tensor:
    """(B, T) log-probs of the batch's responses by the trainer's :func:`policy_logprobs` under ``variant``."""
    from credo.train.forward import policy_logprobs, trim

    was_training = model.training
    model.eval()
    try:
        if not variant.one_row:
            lp, _ = policy_logprobs(model, batch, temperature=batch.temperature, opts=variant.opts)
            return lp.float().cpu()
        width = batch.responses.shape[1]
        rows = []
        for i in range(batch.batch_size):
            lp, _ = policy_logprobs(model, trim(batch.select(torch.tensor([i]))), temperature=batch.temperature,
                                    opts=variant.opts)
            rows.append(torch.nn.functional.pad(lp.float().cpu(), (0, width - lp.shape[1])))
        return torch.cat(rows)
    finally:
        model.train(was_training)


# ---------------------------------------------------------------- prompts and batches


def task_prompts(cfg, tokenizer, rows: int, seed: int) -> list[list[int]]:
    """``rows`` prompt-id rows: ceil(rows / group_size) seeded prompts of the configured task (formatted as a run
    formats them), each repeated rollout.group_size times (so prompts are shared, as in a GRPO group)."""
    from credo.data.source import format_prompts, load_task_data
    from credo.models.tokenizer import encode_prompt

    data = format_prompts(load_task_data(cfg.task, seed=seed), tokenizer, template=cfg.task.prompt_template,
                          chat=cfg.task.chat_template)
    pool = data.train or data.eval
    if not pool:
        raise ValueError(f"task {cfg.task.name!r} has no prompts")
    group = max(1, min(cfg.rollout.group_size, rows))
    picked = random.Random(seed).sample(pool, min(math.ceil(rows / group), len(pool)))
    ids = [encode_prompt(tokenizer, ex.prompt) for ex in picked]
    return [ids[(r // group) % len(ids)] for r in range(rows)]


def batch_of(prefixes: list[list[int]], conts: list, *, pad_id: int, temperature: float):
    """The trainer's batch (credo.models.batch.collate) of prefixes and the engine's continuations."""
    from credo.models.batch import collate

    trajs = [Trajectory(example=Example("", ""), group_id=i, prompt_ids=list(p), response_ids=list(c.ids),
                        rollout_logprobs=list(c.logprobs), response_mask=[1] * len(c.ids),
                        finish_reason="eos" if c.finish_reason == "stop" else "length")
             for i, (p, c) in enumerate(zip(prefixes, conts))]
    return collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=pad_id, temperature=temperature)


def second_turn(tokenizer, prefixes: list[list[int]], conts: list) -> list[list[int]]:
    """Each row's history extended by its first-turn continuation and a short observation."""
    obs = list(tokenizer(SECOND_TURN, add_special_tokens=False)["input_ids"])
    return [list(p) + list(c.ids) + obs for p, c in zip(prefixes, conts)]


# ---------------------------------------------------------------- engines


def hf_runs(model, tokenizer, prefixes, sp: SamplingParams, key: int, want_layers: bool) -> tuple[list, Any]:
    """credo's HF engine: the batch call and its engine variants; with ``want_layers`` also the per-row engine
    decode's per-layer states (for localisation), else None."""
    from credo.rollout.hf import HFRolloutEngine
    from credo.rollout.kv_reuse import KVSession

    pad, temp = tokenizer.pad_token_id, sp.temperature or 1.0
    engine = HFRolloutEngine(model, tokenizer, seed=0, max_batch_size=max(len(prefixes), 1))
    runs = []
    sessions = [KVSession() for _ in prefixes] if engine.kv_sessions else None
    conts = engine.continue_ids(prefixes, sp, stream=(key, 0), sessions=sessions)
    runs.append(EngineRun("batch", "one call, all rows (one prefill per distinct prompt)",
                          batch_of(prefixes, conts, pad_id=pad, temperature=temp)))
    states: Any = None
    try:
        if want_layers:
            row_conts, states = engine_layer_states(engine, prefixes, sp, key)
    except NotImplementedError as e:  # not a Llama-family backbone: no engine-side layer states
        states = str(e)
    if not isinstance(states, torch.Tensor):
        row_conts = [engine.continue_ids([p], sp, stream=(key, i))[0] for i, p in enumerate(prefixes)]
    runs.append(EngineRun("rows_1", "each row decoded alone", batch_of(prefixes, row_conts, pad_id=pad,
                                                                       temperature=temp)))
    generic = HFRolloutEngine(model, tokenizer, seed=0, max_batch_size=max(len(prefixes), 1), lean=False)
    g = generic.continue_ids(prefixes, sp, stream=(key, 0))
    runs.append(EngineRun("generic_decode", "transformers' generic decode step (the lean decode off)",
                          batch_of(prefixes, g, pad_id=pad, temperature=temp)))
    if sessions is not None:
        turn2 = second_turn(tokenizer, prefixes, conts)
        on = engine.continue_ids(turn2, sp, stream=(key + 1, 0), sessions=sessions)
        reused = sum(s.reused_tokens for s in sessions)
        off = engine.continue_ids(turn2, sp, stream=(key + 1, 0))
        runs.append(EngineRun("kv_reuse_on", "a second turn on the first turn's KV sessions",
                              batch_of(turn2, on, pad_id=pad, temperature=temp), {"reused_tokens": reused}))
        runs.append(EngineRun("kv_reuse_off", "the same second turn, fully prefilled",
                              batch_of(turn2, off, pad_id=pad, temperature=temp)))
    return runs, ((row_conts, states) if want_layers else None)


def long_history(tokenizer, row: int, prefix: list[int], tokens: int) -> list[int]:
    """A first turn long enough to fill whole KV blocks: a tag naming the row (so no two rows share a block, and a
    reset cache is cold for every row) and ``prefix`` repeated up to at least ``tokens`` tokens."""
    tag = list(tokenizer(f"[{row}] ", add_special_tokens=False)["input_ids"])
    return tag + list(prefix) * max(1, math.ceil(tokens / max(len(prefix), 1)))


def _reset_prefix_cache(engine) -> None:
    transport = engine.transport
    if hasattr(transport, "llm"):
        transport.llm.reset_prefix_cache()
    else:  # server mode
        transport.weights.post("reset_prefix_cache")


def vllm_runs(model, tokenizer, prefixes, sp: SamplingParams, key: int, cfg, dtype: str) -> list[EngineRun]:
    """vLLM (its CPU build here, CUDA on a GPU machine): the batch call, each row alone, and a second turn with
    its history in the prefix cache (warm) or after a reset (cold). One engine start."""
    from credo.rollout.vllm_engine import VLLMRolloutEngine, VLLMUnavailable, vllm_problem
    from credo.rollout.vllm_transport import VLLMOptions

    opts = dataclasses.replace(VLLMOptions.of(cfg.rollout.vllm), dtype=dtype)
    problem = vllm_problem(opts.mode, opts.url)
    if problem is not None:
        raise VLLMUnavailable(f"--engine vllm: {problem}")
    pad, temp = tokenizer.pad_token_id, sp.temperature or 1.0
    engine = VLLMRolloutEngine.from_model(model, tokenizer, seed=0, options=opts)
    try:
        conts = engine.continue_ids(prefixes, sp, stream=(key, 0))
        runs = [EngineRun("batch", "one call, all rows", batch_of(prefixes, conts, pad_id=pad, temperature=temp))]
        rows = [engine.continue_ids([p], sp, stream=(key, i))[0] for i, p in enumerate(prefixes)]
        runs.append(EngineRun("rows_1", "each row its own call", batch_of(prefixes, rows, pad_id=pad,
                                                                         temperature=temp)))
        history = [long_history(tokenizer, i, p, HISTORY_TOKENS) for i, p in enumerate(prefixes)]
        turn2 = second_turn(tokenizer, history, engine.continue_ids(history, sp, stream=(key + 1, 0)))
        warm = engine.continue_ids(turn2, sp, stream=(key + 2, 0))
        _reset_prefix_cache(engine)
        cold = engine.continue_ids(turn2, sp, stream=(key + 2, 0))
        for name, c, what in (("prefix_cache_warm", warm, "a second turn, its history in the prefix cache"),
                              ("prefix_cache_cold", cold, "the same second turn after a prefix-cache reset")):
            cached = sum(x.cached_tokens or 0 for x in c)
            runs.append(EngineRun(name, what, batch_of(turn2, c, pad_id=pad, temperature=temp),
                                  {"cached_tokens": cached, "prefix_caching": opts.prefix_caching}))
        return runs
    finally:
        engine.close()


# ---------------------------------------------------------------- the measurement


def measure(model: torch.nn.Module, tokenizer, cfg, opts: ParityOptions) -> dict:
    """The parity report (module docstring; the layout in docs/parity.md)."""
    torch.manual_seed(opts.seed)
    prefixes = task_prompts(cfg, tokenizer, opts.rows, opts.seed)
    sp = dataclasses.replace(SamplingParams.of(cfg.rollout), seed=None)
    key = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(opts.seed)))
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    engine_states = None
    if opts.engine == "hf":
        runs, engine_states = hf_runs(model, tokenizer, prefixes, sp, key, opts.layers)
    elif opts.engine == "vllm":
        runs = vllm_runs(model, tokenizer, prefixes, sp, key, cfg, dtype)
    else:
        raise ValueError(f"--engine must be hf or vllm, got {opts.engine!r}")
    main = runs[0].batch
    variants = trainer_variants(cfg)
    lps = {v.name: trainer_logprobs(model, main, v) for v in variants}
    rows = []
    for v in variants:
        st = token_stats(lps[v.name], main.rollout_logprobs, main.response_mask)
        st["vs_padded_max_abs"] = _max_abs(lps[v.name], lps["padded"], main.response_mask)
        rows.append({"name": f"trainer:{v.name}", "side": "trainer", "description": v.description, **st})
    padded = variants[0]
    for run in runs[1:]:
        st = token_stats(trainer_logprobs(model, run.batch, padded), run.batch.rollout_logprobs,
                         run.batch.response_mask)
        rows.append({"name": f"engine:{run.name}", "side": "engine", "description": run.description, **st,
                     **run.info})
    report = {"engine": opts.engine, "dtype": dtype, "device": str(next(model.parameters()).device),
              "rows": opts.rows, "seed": opts.seed, "prompts": len({tuple(p) for p in prefixes}),
              "sampling": dataclasses.asdict(sp), "bounds": list(BOUNDS),
              "shared_prompts": _shares(main), "variants": rows}
    if opts.layers:
        report["layers"] = layer_report(model, main, variants, engine_states, opts, prefixes=prefixes,
                                        pad_id=tokenizer.pad_token_id)
    worst = [r["out_of_range"] for r in rows if r["out_of_range"] is not None]
    report["worst_out_of_range"] = max(worst) if worst else None
    return report


def _max_abs(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    keep = mask.bool()
    return float((a.double() - b.double())[keep].abs().max()) if keep.any() else 0.0


def _shares(batch) -> bool:
    from credo.train.forward import shared_prompts

    return shared_prompts(batch) is not None


def layer_report(model, batch, variants: list[TrainerVariant], engine_states, opts: ParityOptions, *,
                 prefixes: list[list[int]], pad_id: int) -> dict:
    """First diverging layer: each trainer variant against the padded forward, and (HF) the engine's per-row
    decode against the trainer's padded forward of the same tokens."""
    from credo.inspect.parity_layers import decoder_layers

    try:
        names = layer_names(len(decoder_layers(model)[1]))
    except NotImplementedError as e:
        return {"names": [], "tol": opts.layer_tol, "comparisons": [], "note": f"not localised: {e}"}
    ref = trainer_layer_states(model, batch, variants[0].opts)
    out: list[dict] = []
    for v in variants[1:]:
        if v.head_only:
            out.append({"a": "trainer:padded", "b": f"trainer:{v.name}",
                        "skipped": "the same backbone forward as padded (only the output head differs)"})
            continue
        out.append(localise("trainer:padded", f"trainer:{v.name}",
                            _states_of(model, batch, v, ref), names, opts.layer_tol))
    note = None
    if opts.engine == "vllm":
        note = ("vLLM does not expose per-layer hidden states: the engine side is not localised, only the trainer "
                "variants against each other (docs/parity.md)")
    elif engine_states is not None and isinstance(engine_states[1], str):
        out.append({"a": "trainer:padded", "b": "engine:rows_1 (HF)", "skipped": engine_states[1]})
    elif engine_states is not None:
        conts, states = engine_states
        rows_batch = batch_of(prefixes, conts, pad_id=pad_id, temperature=batch.temperature)
        out.append(localise("trainer:padded", "engine:rows_1 (HF)",
                            lambda: (trainer_layer_states(model, rows_batch, variants[0].opts), states),
                            names, opts.layer_tol))
    return {"names": names, "tol": opts.layer_tol, "comparisons": out, "note": note}


def _states_of(model, batch, v: TrainerVariant, ref: torch.Tensor) -> Callable[[], tuple]:
    return lambda: (ref, trainer_layer_states(model, batch, v.opts, one_row=v.one_row))
