"""Forward passes over a :class:`TrainBatch`: response log-probs, per-token statistics, critic values."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from credo.algo import entropy_from_logits, logprobs_from_logits
from credo.algo.logprobs import check_token_stats, token_stats_from_logits
from credo.algo.chunked import chunked_logprobs_entropy, chunked_token_stats
from credo.train.activation_checkpointing import recomputing
from credo.train.fsdp import sharded_root
from credo.train.mixed_precision import compute, full_precision, no_autocast
from credo.models.compat import cache_kwargs, output_cache
from credo.train.packing import pack, token_budget_groups, valid_responses
from credo.train.shared_pack import packed_shared_hidden
from credo.models.batch import PIXEL_VALUES
from credo.types import BATCH_EXTRAS, TrainBatch, declare_extra

VALUE_QUANTILES = declare_extra("value_quantiles", "the critic pass at collection (credo.train.forward.batched_values, "
                                "or a flow critic's target pass), quantile critics only: (B, T, M) the head-mean "
                                "quantiles, 0 outside the loss mask")


def _inputs(batch: TrainBatch, device: torch.device) -> dict[str, torch.Tensor]:
    out = {"input_ids": batch.input_ids.to(device), "attention_mask": batch.attention_mask.to(device),
           "position_ids": batch.position_ids.to(device)}
    if PIXEL_VALUES in batch.extras:  # a vision-language policy: the rows' images (consumed at the prompt)
        out["pixel_values"] = batch.extras[PIXEL_VALUES].to(device)
    return out


@dataclass(frozen=True)
class ForwardOptions:
    """How the policy forward turns hidden states into per-token statistics.

    chunk_size: rows of the (N, V) logits computed at a time (None = about 2^26 logits per chunk; 0 = the whole
    (B, T, V) logits at once, the naive path); pack: pack sequences into dense rows (no padding) of at most
    ``row_tokens`` tokens."""

    chunk_size: int | None = None
    pack: bool = False
    row_tokens: int | None = None  # None = the longest sequence of the micro-batch
    share_prompt: bool = False  # rows with the same prompt run it once (when pack is off)
    pack_responses: bool = False  # ... and their responses run packed, without padding (credo.train.shared_pack)
    autocast: str = "none"  # train.mixed_precision for the backbone's autocast (none under FSDP2: its policy casts)

    @classmethod
    def of(cls, cfg) -> "ForwardOptions":
        t = cfg.train
        # FSDP2: every rank must run the same modules in the same order (each unit's gather and reduce-scatter is
        # a collective), which the shared-prompt forward (the backbone twice, only where prompts repeat) breaks
        share = t.share_prompt and cfg.distributed.strategy != "fsdp2"
        autocast = t.mixed_precision if cfg.distributed.strategy != "fsdp2" else "none"
        return cls(chunk_size=t.logprob_chunk_size, pack=t.pack, row_tokens=t.pack_row_tokens, share_prompt=share,
                   pack_responses=share and t.pack_responses, autocast=autocast)


NAIVE = ForwardOptions(chunk_size=0, pack=False)


def response_logits(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """Temperature-scaled logits that predict each response token: (B, T, V) (the naive path)."""
    device = next(model.parameters()).device
    out = model(**_inputs(batch, device), use_cache=False)
    p, t = batch.prompt_len, batch.responses.shape[1]
    logits = out.logits[:, p - 1 : p - 1 + t, :]  # (B, T, V)
    return logits / temperature if temperature not in (0.0, 1.0) else logits


def _lm_head(model: torch.nn.Module) -> torch.nn.Linear:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or getattr(model, "base_model", model) is model:
        raise ValueError(f"{type(model).__name__} has no backbone + linear output head; set train.logprob_chunk_size=0 "
                         "and train.pack=false (the full-logits path)")
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError("logit soft-capping is not supported by the chunked path; set train.logprob_chunk_size=0")
    return head


def response_hidden(model: torch.nn.Module, batch: TrainBatch, opts: ForwardOptions):
    """Final hidden states that predict the batch's real response tokens, row-major:
    (hidden (N, H), labels (N,), valid (B, T) bool)."""
    device = next(model.parameters()).device
    if opts.pack:
        if PIXEL_VALUES in batch.extras:
            raise ValueError("train.pack: not implemented with images (packing does not order the images with "
                             "their token blocks); set train.pack=false")
        packed = pack(batch, opts.row_tokens or 0)
        out = model.base_model(input_ids=packed.input_ids.to(device), position_ids=packed.position_ids.to(device),
                               attention_mask=None, use_cache=False).last_hidden_state  # (R, S, H)
        hidden = out.reshape(-1, out.shape[-1])[packed.response_index.to(device)]  # (N, H)
        return hidden, packed.labels.to(device), packed.valid.to(device)
    valid = valid_responses(batch).to(device)  # (B, T)
    # layer checkpointing drops the KV cache the shared-prompt forward runs the responses on (activation_checkpointing)
    shared = shared_prompts(batch) if opts.share_prompt and not recomputing(model) else None
    if shared is not None and opts.pack_responses:
        hidden = packed_shared_hidden(model, batch, *shared, valid, opts.row_tokens)  # (N, H)
        return hidden, batch.responses.to(device)[valid], valid
    if shared is not None:
        hidden = shared_prompt_hidden(model, batch, *shared)  # (B, T, H)
    else:
        p, t = batch.prompt_len, batch.responses.shape[1]
        out = model.base_model(**_inputs(batch, device), use_cache=False).last_hidden_state  # (B, P + T, H)
        hidden = out[:, p - 1 : p - 1 + t]  # (B, T, H)
    return hidden[valid], batch.responses.to(device)[valid], valid


def shared_prompts(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each distinct prompt (U,), each row's prompt index (B,)), or None when no two rows share one."""
    p = batch.prompt_len
    parts = [batch.input_ids[:, :p], batch.attention_mask[:, :p], batch.position_ids[:, :p]]
    if PIXEL_VALUES in batch.extras:  # a prompt is its tokens and its image (float32 bits compared exactly)
        parts.append(batch.extras[PIXEL_VALUES].float().flatten(1).contiguous().view(torch.int32).long())
    key = torch.cat(parts, dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(uniq) == batch.batch_size:
        return None
    first = torch.full((len(uniq),), batch.batch_size, dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(batch.batch_size), reduce="amin")
    return first, inverse


def shared_prompt_hidden(model: torch.nn.Module, batch: TrainBatch, first: torch.Tensor,
                         inverse: torch.Tensor) -> torch.Tensor:
    """Final hidden states predicting every response column, (B, T, H), with each distinct prompt run once.

    The prompts' forward (U rows) keeps its keys and values; they are gathered to the B rows (a differentiable
    index, so each prompt's gradient is the sum over the rows that share it) and the responses run on top of
    them, as generation does. The hidden state at the last prompt column predicts response token 0; response
    column t - 1 predicts token t. Equal to the full forward up to float rounding (tested in float64)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    p, t = batch.prompt_len, batch.responses.shape[1]
    ids, attn, pos = (x.to(device) for x in (batch.input_ids, batch.attention_mask, batch.position_ids))
    rows = first.to(device)
    cache = DynamicCache(config=model.config)
    pixels = batch.extras.get(PIXEL_VALUES)  # (B, 3, H, W) or None
    images = {} if pixels is None else {"pixel_values": pixels.to(device)[rows]}
    out = model.base_model(input_ids=ids[rows, :p], attention_mask=attn[rows, :p], position_ids=pos[rows, :p],
                           **cache_kwargs(model.base_model, cache), use_cache=True, **images)
    index = inverse.to(device)
    first_hidden = out.last_hidden_state[:, -1][index].unsqueeze(1)  # (B, 1, H): predicts response token 0
    if t == 1:
        return first_hidden
    cache = output_cache(out)
    cache.reorder_cache(index)  # (U, ...) -> (B, ...) keys and values, differentiable
    rest = model.base_model(input_ids=ids[:, p : p + t - 1], attention_mask=attn[:, : p + t - 1],
                            position_ids=pos[:, p : p + t - 1], **cache_kwargs(model.base_model, cache),
                            use_cache=True).last_hidden_state
    return torch.cat([first_hidden, rest], dim=1)  # (B, T, H)


def _scatter(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(N,) values at the True positions of ``valid`` (B, T), zeros elsewhere: (B, T)."""
    rows, cols = valid.nonzero(as_tuple=True)
    return values.new_zeros(valid.shape).index_put((rows, cols), values)


def in_forward(model: torch.nn.Module, fn, *args):
    """``fn(model, *args)``; for a policy sharded with FSDP2, inside its root's forward, which gathers the
    parameters the backbone and the output head need (credo.train.fsdp)."""
    root = sharded_root(model)
    return fn(model, *args) if root is None else root(fn, *args)


def policy_logprobs(
    model: torch.nn.Module, batch: TrainBatch, *, temperature: float = 1.0, with_entropy: bool = False,
    opts: ForwardOptions = ForwardOptions(),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs (B, T), entropy (B, T) or None) of the batch's responses under ``model``; differentiable.
    Positions past a response's end are 0."""
    return in_forward(model, _policy_logprobs, batch, temperature, with_entropy, opts)


def _policy_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float, with_entropy: bool,
                     opts: ForwardOptions) -> tuple[torch.Tensor, torch.Tensor | None]:
    # mixed precision: the backbone computes in bf16, the log-probs in float32 (credo.train.mixed_precision)
    if opts.chunk_size == 0 and not opts.pack:
        with compute(model, opts.autocast):
            logits = response_logits(model, batch, temperature)
        (logits,) = full_precision(logits)
        labels = batch.responses.to(logits.device)
        with no_autocast(logits):
            logprobs = logprobs_from_logits(logits, labels)  # (B, T)
            entropy = entropy_from_logits(logits) if with_entropy else None  # (B, T)
        valid = valid_responses(batch).to(logits.device)
        return logprobs * valid, (entropy * valid if entropy is not None else None)
    head = _lm_head(model)
    with compute(model, opts.autocast):
        hidden, labels, valid = response_hidden(model, batch, opts)
    hidden, weight, bias = full_precision(hidden, head.weight, head.bias)
    with no_autocast(hidden):
        lp, ent = chunked_logprobs_entropy(hidden, weight, labels, bias=bias, temperature=temperature or 1.0,
                                           chunk_size=opts.chunk_size or None, with_entropy=with_entropy)
    return _scatter(lp, valid), (_scatter(ent, valid) if ent is not None else None)


def micro_batches(batch: TrainBatch, *, size: int | None = None, tokens: int | None = None) -> list[TrainBatch]:
    """Consecutive micro-batches of ``size`` sequences, or of at most ``tokens`` real tokens each."""
    if tokens is not None:
        lengths = batch.attention_mask.sum(-1).tolist()
        return [batch.select(torch.tensor(g)) for g in token_budget_groups(lengths, tokens)]
    return [batch.select(rows) for rows in torch.arange(batch.batch_size).split(size or batch.batch_size)]


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module, batch: TrainBatch, *, micro_batch_size: int | None, temperature: float = 1.0,
    stats: tuple[str, ...] = (), opts: ForwardOptions = ForwardOptions(), micro_batch_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """No-grad log-probs of the whole batch plus the requested ``TOKEN_STATS``, in micro-batches, on the CPU."""
    check_token_stats(stats)
    was_training = model.training
    model.eval()
    lps: list[torch.Tensor] = []
    out: dict[str, list[torch.Tensor]] = {name: [] for name in stats}
    width = batch.responses.shape[1]
    try:
        for mb in micro_batches(batch, size=micro_batch_size, tokens=micro_batch_tokens):
            mb = trim(mb)
            lp, st = in_forward(model, _micro_stats, mb, temperature, stats, opts)
            lps.append(_pad_to(lp.cpu(), width))
            for name in stats:
                out[name].append(_pad_to(st[name].cpu(), width))
    finally:
        model.train(was_training)
    return torch.cat(lps), {name: torch.cat(parts) for name, parts in out.items()}


def trim(mb: TrainBatch) -> TrainBatch:
    """Drop the columns that are padding in every row of a micro-batch (left of the prompts, right of the
    responses); the layout invariant (response token t predicted at column P - 1 + t) is kept."""
    attn = mb.attention_mask.bool()
    p = mb.prompt_len
    left = int((~attn[:, :p]).all(0).long().cumprod(0).sum())  # leading all-padding prompt columns
    left = min(left, p - 1)  # keep at least one prompt column
    t = max(int(attn[:, p:].sum(-1).max()), 1)
    if left == 0 and t == mb.responses.shape[1]:
        return mb
    out = {}
    for name in mb.__dataclass_fields__:
        v = getattr(mb, name)
        if name in ("input_ids", "attention_mask", "position_ids"):
            v = v[:, left : p + t]
        elif isinstance(v, torch.Tensor) and v.dim() >= 2:  # (B, T) response tensors
            v = v[:, :t]
        out[name] = v
    # extras declared per token, (B, T, ...), lose the same columns; per-row ones ((B,), images) are kept
    out["extras"] = {k: v[:, :t] if isinstance(v, torch.Tensor) and v.dim() >= 2 and BATCH_EXTRAS.get(k).per_token
                     else v for k, v in mb.extras.items()}
    out["prompt_len"] = p - left
    return TrainBatch(**out)


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1])) if x.shape[1] < width else x


def _micro_stats(model, mb: TrainBatch, temperature: float, stats: tuple[str, ...], opts: ForwardOptions):
    if opts.chunk_size == 0 and not opts.pack:
        with compute(model, opts.autocast):
            logits = response_logits(model, mb, temperature)
        (logits,) = full_precision(logits)
        labels = mb.responses.to(logits.device)
        valid = valid_responses(mb).to(logits.device)
        with no_autocast(logits):
            st = token_stats_from_logits(logits, labels, stats)
            return logprobs_from_logits(logits, labels) * valid, {name: v * valid for name, v in st.items()}
    head = _lm_head(model)
    with compute(model, opts.autocast):
        hidden, labels, valid = response_hidden(model, mb, opts)
    hidden, weight, bias = full_precision(hidden, head.weight, head.bias)
    with no_autocast(hidden):
        lp, st = chunked_token_stats(hidden, weight, labels, stats, bias=bias, temperature=temperature or 1.0,
                                     chunk_size=opts.chunk_size or None)
    return _scatter(lp, valid), {name: _scatter(v, valid) for name, v in st.items()}


def response_outputs(critic: torch.nn.Module, batch: TrainBatch):
    """Everything the critic's head says (:class:`credo.models.value.CriticOutput`) about the state before each
    response token: values (B, T), and by head kind quantiles (B, T, N, M), kl and aux (B, T)."""
    device = next(critic.parameters()).device
    p, t = batch.prompt_len, batch.responses.shape[1]
    return critic.outputs(**_inputs(batch, device)).slice(p - 1, p - 1 + t)


@torch.no_grad()
def batched_values(critic: torch.nn.Module, batch: TrainBatch, *,
                   micro_batch_size: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values (B, T), head-mean quantiles (B, T, M) or None) at collection time. Values are kept on every real
    response token (environment and tool tokens too: GAE's ``bootstrap="agentgym"`` reads the value after a turn)
    and zero on padding; quantiles are zero outside the loss mask."""
    was_training = critic.training
    critic.eval()
    size = micro_batch_size or batch.batch_size
    values, quantiles = [], []
    try:
        for s in range(0, batch.batch_size, size):
            out = response_outputs(critic, batch.select(torch.arange(s, min(s + size, batch.batch_size))))
            values.append(out.values.cpu())
            if out.quantiles is not None:
                quantiles.append(out.quantiles.mean(-2).cpu())  # (b, T, M): the ensemble's mean quantiles
    finally:
        critic.train(was_training)
    mask = batch.response_mask
    real = batch.attention_mask[:, batch.prompt_len:].to(mask.dtype)  # (B, T) 1 on response tokens, 0 on padding
    q = torch.cat(quantiles) * mask.unsqueeze(-1) if quantiles else None
    return torch.cat(values) * real, q
