"""The cost model behind ``credo plan``: predicted per-rank memory and FLOPs of one RL step (pure functions).

Notation: V vocabulary, H hidden size, I MLP (intermediate) size, L layers, a attention heads, k key/value heads,
d = H / a head dimension, kv = k * d, b bytes per element of the model's dtype, W data-parallel ranks.

Memory per rank (bytes)::

    parameters   P_bytes  = N * b                               DDP; FSDP2: / W
    gradients    G_bytes  = N_train * b                         DDP; FSDP2: / W
    AdamW state  O_bytes  = 2 * N_train * b                     exp_avg, exp_avg_sq; DDP; FSDP2: / W
    reference    R_bytes  = N * b                               only with algo.kl_coef > 0 (replicated)
    activations  A_bytes  = T_mb * (L * (9 H + 2 kv' + 4 I + a) + 3 H) * b  +  head_bytes  (training micro-batch)
    KV cache     KV_bytes = 2 * L * k * d * b * S_gen * (prompt + max_new_tokens)        (rollout batch)
    FSDP2 adds   E_bytes  = N * b (the in-process engine's unsharded copy) and the largest gathered unit U_bytes
    mixed prec.  C_bytes  = 2 * N_linear (autocast's bf16 / fp16 copies of the layers' linear weights; one
                            layer's with checkpointing; 0 under FSDP2, whose units are gathered in bf16: U * 2 / b)
    peak        ~= P + G + O + R + E + max(A + U + C, KV)       (generation and the update run one after another)
    offload      O moves to the host (+ the float32 master and the gradients' copy: host = 4 N_train b);
                 FSDP2's CPUOffloadPolicy moves P, G and O (per rank, / W) to the host
    LoRA         N += r (in + out) per targeted projection per layer; N_train = the adapters'; no reference copy
                 (the reference is the policy with its adapters off)

The peak is an upper bound: gradients fill up during the backward while the activations are freed.

The optimizer state is ``torch.optim.AdamW``'s two moments, ``zeros_like(param)``: the parameter dtype (float32 for
credo's default ``model.dtype=float32``, the usual "two fp32 moments"). credo builds AdamW with ``fused=True``
(credo.train.optim): the fused kernel updates in place and keeps no fp32 master copy and no per-tensor
temporaries, so nothing beyond the two moments (and a scalar ``step`` per tensor) is counted.

Activations [derived, adapted from Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", eq. 2, whose 34 s b h + 5 a s^2 b bytes per layer is for GPT with a 4H GELU MLP, 16-bit activations and
dropout]: the elements autograd keeps per layer per token for a Qwen2 / Llama block without recomputation and
without dropout are, by module,
  two RMSNorms   2 x 3 H  (input, normalised input, weighted output; HF's Qwen2RMSNorm),
  attention      3 H + 2 kv' (rotated q, the SDPA output and its reshaped copy read by o_proj; k and v, where
                           kv' = H when a padding mask makes transformers repeat_kv them to every head and kv'
                           = kv without a mask, where SDPA takes enable_gqa) + a (SDPA's log-sum-exp per head;
                           the eager kernel keeps a * s attention probabilities per token instead),
  SwiGLU MLP     4 I      (gate, silu(gate), up, their product read by down_proj),
i.e. 9 H + 2 kv' + 4 I + a (11 H + 4 I + a with a mask) per layer per token, plus 3 H for the final norm.
With ``train.activation_checkpointing`` each layer keeps only its input hidden state and the backward recomputes
one layer at a time, so L * (9 H + 2 kv' + 4 I + a) becomes L * H + (9 H + 2 kv' + 4 I + a) [derived; measured on
the CPU in docs/performance.md, "Activation checkpointing"]. T_mb = micro-batch sequences x (prompt + response) tokens. Validated on the CPU (docs/plan.md, 5-8% above the
measured saved tensors).

Mixed precision (``train.mixed_precision`` bf16 / fp16, float32 master weights) [derived, measured on the CPU in
docs/plan.md]: parameters, gradients and AdamW state stay float32. Under autocast a layer keeps per token: the two
RMSNorms' float32 input and normalised input (2 x 2 H x 4 bytes), the bf16 casts of the projections' inputs (q, k,
v, gate and up each cast the norm's float32 output: 5 H x 2), the attention's 3 H + 2 kv' and the MLP's 4 I in
bf16 (x 2), SDPA's log-sum-exp in float32 (a x 4); the residual stream (the layers' inputs, kept under
checkpointing) and the final norm stay float32. Under FSDP2's MixedPrecisionPolicy the residual stream is bf16
and the norms keep their bf16 cast and output (4 H x 2) instead of the 5 casts [derived, not measured]. The log-prob head never holds the (T, V) logits: ``train.logprob_chunk_size`` rows (default
2^26 / V, credo.algo.chunked) are formed at a time, so the head adds the kept response hidden states plus, at the
peak of its backward, 3 float32 (chunk, V) blocks (logits, probabilities, their gradient) [derived];
``logprob_chunk_size=0`` materialises (T_resp, V) logits instead (counted as 3 float32 copies too).

FLOPs per RL step (all ranks; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1: a forward
pass costs 2 N + 2 L n_ctx d_attn per token, forward + backward about 3x that, so 6 N)::

    generation   2 N_mm per prompt token (prefill) and per generated token, + attention 4 L H ctx per token
    training     6 N_body per token of prompt + response, 8 V H per response token (the head runs only on them;
                 its chunked backward recomputes the logits, 2 V H more; 6 V H with logprob_chunk_size=0),
                 + attention 3 x 4 L H s per token, times train.ppo_epochs; activation checkpointing adds
                 one more forward of the layers (2 N_body + 4 L H s per token)
    old log-prob 2 N_body per token + 2 V H per response token + attention 4 L H s, when the pass runs
    reference    the same forward again when algo.kl_coef > 0

N_mm counts the matmul weights (the layers' linears and the output projection; an embedding lookup is free) and
N_body = N_mm - V H. The attention terms count full s x s score matrices (QK^T and AV, 2 s H each per layer per
token), as torch.utils.flop_counter does; a causal kernel does about half of that. Not modelled: a critic, the
vLLM engine's own memory, packing's padding savings, LoRA's FLOPs (r (in + out) per token per targeted
projection: small next to the base's).
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CHUNK_ELEMENTS = 2**26  # credo.algo.chunked.CHUNK_ELEMENTS (not imported: that module imports torch)
GIB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2 / Llama decoder that the cost model reads."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool = True
    qkv_bias: bool = True  # Qwen2 has q/k/v biases, Llama not

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class Hardware:
    """``count`` devices of ``mem_gb`` GiB each; kind "gpu" or "cpu" (one rank per device)."""

    kind: str
    count: int
    mem_gb: float


@dataclass(frozen=True)
class Workload:
    """What one RL step runs: ``sequences`` = prompts_per_step x group_size over all ranks."""

    sequences: int
    prompt_tokens: int
    new_tokens: int
    micro_batch: int  # sequences per forward / backward on one rank
    gen_batch: int  # sequences decoded at once on one rank
    dtype: str = "float32"
    chunk_size: int | None = None  # train.logprob_chunk_size (None = 2^26 / V, 0 = full logits)
    ppo_epochs: int = 1
    old_logprob_pass: bool = False
    reference: bool = False  # algo.kl_coef > 0: a frozen reference model
    eager_attention: bool = False
    masked: bool = True  # padded batches carry an attention mask (k, v repeated to every head); False = no mask
    trainable_params: int | None = None  # None = all parameters (LoRA: the adapters')
    activation_checkpointing: bool = False  # train.activation_checkpointing: layers keep only their inputs
    mixed_precision: str = "none"  # train.mixed_precision: bf16 / fp16 compute over float32 master weights
    optimizer_offload: bool = False  # train.optimizer_offload: AdamW state (FSDP2: all shards) in host memory
    lora_rank: int = 0  # model.lora.r (0 = no LoRA)
    lora_targets: tuple[str, ...] = ()  # model.lora.target_modules

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of what the layers compute and keep: 2 under mixed precision, else the dtype's."""
        return 2 if self.mixed_precision in ("bf16", "fp16") else DTYPE_BYTES[self.dtype]


def layer_params(m: ModelShape) -> int:
    """Weights of one decoder layer: q, o (H x H), k, v (H x kv), biases of q/k/v when Qwen2, the SwiGLU MLP
    (3 H I) and two RMSNorm weights (2 H)."""
    attn = 2 * m.hidden * m.hidden + 2 * m.hidden * m.kv_dim
    bias = (m.hidden + 2 * m.kv_dim) if m.qkv_bias else 0
    return attn + bias + 3 * m.hidden * m.intermediate + 2 * m.hidden


def param_count(m: ModelShape) -> int:
    """N = V H (embedding) + L * layer + H (final norm) + V H when the output projection is not tied."""
    return m.vocab * m.hidden * (1 if m.tied else 2) + m.layers * layer_params(m) + m.hidden


def matmul_params(m: ModelShape) -> int:
    """N_mm: weights that take part in a matmul per token (layers' linears + the output projection V H)."""
    linears = m.layers * (layer_params(m) - 2 * m.hidden - ((m.hidden + 2 * m.kv_dim) if m.qkv_bias else 0))
    return linears + m.vocab * m.hidden


def linear_dims(m: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear projection of a decoder layer, by its module name."""
    h, kv, i = m.hidden, m.kv_dim, m.intermediate
    return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, i),
            "up_proj": (h, i), "down_proj": (i, h)}


def lora_targets(m: ModelShape, targets: tuple[str, ...]) -> list[tuple[int, int]]:
    """(in, out) of the layer's projections that ``targets`` (model.lora.target_modules) names; an unknown name
    is a ValueError (the cost model knows the seven projections of a Qwen2 / Llama layer)."""
    dims = linear_dims(m)
    names = [str(t).split(".")[-1] for t in targets]
    unknown = [t for t in names if t not in dims]
    if unknown:
        raise ValueError(f"model.lora.target_modules: {unknown} are not modelled (one of {', '.join(dims)})")
    return [dims[t] for t in dict.fromkeys(names)]


def lora_params(m: ModelShape, r: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters: r (in + out) per targeted projection (A: r x in, B: out x r), in every layer."""
    return m.layers * sum(r * (fan_in + fan_out) for fan_in, fan_out in lora_targets(m, targets)) if r else 0


def chunk_rows(m: ModelShape, w: Workload, response_tokens: int) -> int:
    """Rows of the (rows, V) logits block of the log-prob head (credo.algo.chunked.auto_chunk_size)."""
    if w.chunk_size == 0:
        return response_tokens
    rows = w.chunk_size or max(1, CHUNK_ELEMENTS // max(m.vocab, 1))
    return min(rows, response_tokens)


def layer_activation_bytes(m: ModelShape, w: Workload, strategy: str = "ddp") -> int:
    """Bytes one decoder layer keeps for the backward per token (module docstring, "Activations" and "Mixed
    precision"); LoRA adds each targeted projection's r-wide A output (and under autocast the cast of its input)."""
    h, c = m.hidden, w.compute_bytes
    seq = w.prompt_tokens + w.new_tokens
    scores = m.heads * seq if w.eager_attention else m.heads
    kv = m.hidden if w.masked else m.kv_dim  # kv'
    targets = lora_targets(m, w.lora_targets) if w.lora_rank else []
    if w.mixed_precision == "none":
        return (9 * h + 2 * kv + 4 * m.intermediate + scores + w.lora_rank * len(targets)) * c
    autocast = strategy != "fsdp2"  # FSDP2's policy casts the parameters and the layer inputs instead
    # two RMSNorms keep their float32 input and normalised input; the projections' bf16 inputs: under autocast
    # each of q, k, v, gate, up casts the norm's float32 output itself (5 H), under FSDP2 the norms keep their
    # bf16 cast and output (4 H)
    norms = 2 * 2 * h * 4 + (5 if autocast else 4) * h * c
    lora = sum(w.lora_rank * c + (fan_in * c if autocast else 0) for fan_in, _ in targets)
    return norms + (3 * h + 2 * kv + 4 * m.intermediate) * c + scores * 4 + lora  # SDPA's log-sum-exp in fp32


def activation_bytes(m: ModelShape, w: Workload, strategy: str = "ddp") -> int:
    """A_bytes of one training micro-batch (module docstring): layers + final norm + the log-prob head."""
    seq = w.prompt_tokens + w.new_tokens
    tokens = w.micro_batch * seq  # T_mb
    resp = w.micro_batch * w.new_tokens
    b = DTYPE_BYTES[w.dtype]
    layer = layer_activation_bytes(m, w, strategy)
    # the residual stream (the layers' inputs): float32 under autocast (the embedding and the residual adds run
    # in float32), the compute dtype under FSDP2's policy
    resid = w.compute_bytes if strategy == "fsdp2" else b
    # checkpointing: each layer keeps its input (H) and the backward recomputes one layer at a time
    per_token = (m.layers * m.hidden * resid + layer if w.activation_checkpointing else m.layers * layer)
    head = resp * m.hidden * b + 3 * chunk_rows(m, w, resp) * m.vocab * 4  # kept hidden + 3 fp32 (rows, V) blocks
    return tokens * (per_token + 3 * m.hidden * b) + head


def compute_copy_bytes(m: ModelShape, w: Workload, strategy: str = "ddp") -> int:
    """Mixed precision under autocast: the bf16 / fp16 copies of the layers' linear weights that autocast casts
    once per forward and the backward keeps (all layers; one layer's, recomputed, with checkpointing). FSDP2's
    policy gathers its units in the compute dtype instead (the gathered unit); 0 without mixed precision."""
    if w.mixed_precision == "none" or strategy == "fsdp2":
        return 0
    per_layer = sum(fan_in * fan_out for fan_in, fan_out in linear_dims(m).values())
    return (1 if w.activation_checkpointing else m.layers) * per_layer * w.compute_bytes


def kv_cache_bytes(m: ModelShape, w: Workload) -> int:
    """KV_bytes = 2 (K and V) * L * k * d * b * sequences decoded at once * (prompt + max_new_tokens)."""
    return 2 * m.layers * m.kv_dim * DTYPE_BYTES[w.dtype] * w.gen_batch * (w.prompt_tokens + w.new_tokens)


@dataclass(frozen=True)
class Memory:
    """Predicted bytes per rank."""

    params: int
    grads: int
    optimizer: int
    reference: int
    activations: int
    kv_cache: int
    engine_copy: int = 0  # FSDP2: the in-process engine decodes from its own unsharded copy of the weights
    gathered: int = 0  # FSDP2: the largest unit's full parameters, gathered around its forward / backward
    compute_copy: int = 0  # mixed precision under autocast: the bf16 / fp16 copies of the linear weights
    host: int = 0  # optimizer offload: what lives in host memory instead (not part of the device peak)

    @property
    def peak(self) -> int:
        """Device memory at the peak (upper bound); ``host`` is not in it."""
        static = self.params + self.grads + self.optimizer + self.reference + self.engine_copy
        return static + max(self.activations + self.gathered + self.compute_copy, self.kv_cache)


def memory_per_rank(m: ModelShape, w: Workload, strategy: str, world: int) -> Memory:
    """Memory of one rank under ``strategy`` "ddp" (all replicated) or "fsdp2" (params / grads / optimizer / W,
    plus the engine's unsharded copy N b and the largest gathered unit: a layer, or the root's V H (2 V H untied)
    embeddings / head; docs/distributed.md). The reference stays replicated under both."""
    if strategy not in ("ddp", "fsdp2"):
        raise ValueError(f"strategy must be ddp or fsdp2, not {strategy!r}")
    if world < 1:
        raise ValueError(f"world size must be >= 1, not {world}")
    b = DTYPE_BYTES[w.dtype]
    adapters = lora_params(m, w.lora_rank, w.lora_targets)
    n = param_count(m) + adapters
    n_train = adapters if w.lora_rank else (n if w.trainable_params is None else w.trainable_params)
    shard = world if strategy == "fsdp2" else 1
    fsdp = strategy == "fsdp2" and world > 1
    root = m.vocab * m.hidden * (1 if m.tied else 2) + m.hidden
    params, grads, optimizer = -(-n * b // shard), -(-n_train * b // shard), -(-2 * n_train * b // shard)
    host = 0
    if w.optimizer_offload and strategy == "fsdp2":  # CPUOffloadPolicy: the shards and their AdamW state on the host
        host, params, grads, optimizer = params + grads + optimizer, 0, 0, 0
    elif w.optimizer_offload:  # OffloadedAdamW: master copy, two moments and the gradients' copy on the host
        host, optimizer = 4 * n_train * b, 0
    unit = max(layer_params(m) + lora_params(m, w.lora_rank, w.lora_targets) // max(m.layers, 1), root)
    return Memory(params=params, grads=grads, optimizer=optimizer, reference=n * b if w.reference else 0,
                  activations=activation_bytes(m, w, strategy), kv_cache=kv_cache_bytes(m, w),
                  engine_copy=n * b if fsdp else 0, gathered=unit * w.compute_bytes if fsdp else 0,
                  compute_copy=compute_copy_bytes(m, w, strategy), host=host)


@dataclass(frozen=True)
class Flops:
    """Predicted FLOPs of one RL step over all ranks."""

    generation: int
    training: int
    old_logprob: int
    reference: int

    @property
    def total(self) -> int:
        return self.generation + self.training + self.old_logprob + self.reference


def forward_flops(m: ModelShape, sequences: int, seq: int, resp: int) -> int:
    """One forward of ``sequences`` rows of ``seq`` tokens whose last ``resp`` go through the output projection:
    2 N_body per token + 2 V H per response token + 4 L H seq per token (QK^T and AV over full s x s)."""
    body = matmul_params(m) - m.vocab * m.hidden
    tokens = sequences * seq
    return 2 * body * tokens + 2 * m.vocab * m.hidden * sequences * resp + 4 * m.layers * m.hidden * seq * tokens


def generation_flops(m: ModelShape, w: Workload) -> int:
    """Prefill of the prompt (2 N_mm per token + 4 L H p per token) and decoding: generated token t (0-based)
    attends to p + t + 1 positions: sum_t 2 N_mm + 4 L H (p + t + 1)."""
    p, t = w.prompt_tokens, w.new_tokens
    prefill = 2 * matmul_params(m) * p + 4 * m.layers * m.hidden * p * p
    ctx = t * p + t * (t + 1) // 2  # sum over t of (p + t + 1)
    decode = 2 * matmul_params(m) * t + 4 * m.layers * m.hidden * ctx
    return w.sequences * (prefill + decode)


def step_flops(m: ModelShape, w: Workload) -> Flops:
    """FLOPs of one RL step (module docstring): generation + 3 x forward x ppo_epochs + optional forwards."""
    seq = w.prompt_tokens + w.new_tokens
    fwd = forward_flops(m, w.sequences, seq, w.new_tokens)
    # the chunked head's backward recomputes each chunk's logits: + 2 V H per response token (8 V H, not 6 V H)
    recompute = 0 if w.chunk_size == 0 else 2 * m.vocab * m.hidden * w.sequences * w.new_tokens
    if w.activation_checkpointing:  # the backward runs each layer's forward again (not the output projection)
        recompute += fwd - 2 * m.vocab * m.hidden * w.sequences * w.new_tokens
    return Flops(generation=generation_flops(m, w), training=(3 * fwd + recompute) * w.ppo_epochs,
                 old_logprob=fwd if w.old_logprob_pass else 0, reference=fwd if w.reference else 0)


# published config.json shapes (Hugging Face Qwen/Qwen2.5-*; the Qwen2 models of the same size share them)
QWEN2_SHAPES = {
    "0.5B": ModelShape(vocab=151_936, hidden=896, intermediate=4_864, layers=24, heads=14, kv_heads=2, tied=True),
    "1.5B": ModelShape(vocab=151_936, hidden=1_536, intermediate=8_960, layers=28, heads=12, kv_heads=2, tied=True),
    "7B": ModelShape(vocab=152_064, hidden=3_584, intermediate=18_944, layers=28, heads=28, kv_heads=4, tied=False),
}
