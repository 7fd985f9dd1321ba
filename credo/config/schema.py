"""Typed configuration: the one source of defaults.

``credo train`` with no arguments runs exactly these defaults: GRPO on the built-in string
reversal task with a freshly built 0.5M-parameter Qwen2, after a short SFT warm start.
Field metadata: ``choices`` (allowed values), ``min`` / ``max`` (inclusive bounds), ``help``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from credo.config.fields import choice, opt, section, type_key

# the options of the choice sections (type -> "module:Class"; credo.config.fields.register_choice adds one)
COLLECTORS = {"group": "credo.config.schema:GroupCollectorConfig",
              "tree": "credo.methods.attnrl.config:TreeCollectorConfig",
              "agent": "credo.collect.config:AgentCollectorConfig",
              "gateway": "credo.collect.config:GatewayCollectorConfig"}
TOKEN_SELECTORS = {"none": "credo.config.schema:NoSelectConfig", "entropy": "credo.config.schema:EntropySelectConfig",
                   "vepo": "credo.methods.vepo.config:VepoSelectConfig"}


@dataclass
class VisionConfig:
    hidden: int = opt(32, "hidden size of the CLIP vision tower", min=8)
    intermediate: int = opt(64, "MLP size of the vision tower", min=8)
    layers: int = opt(2, "vision tower layers", min=1)
    heads: int = opt(2, "vision tower attention heads", min=1)
    image_size: int = opt(32, "image side in pixels (square images)", min=8)
    patch_size: int = opt(8, "vision patch side; (image_size / patch_size)^2 image tokens per image", min=1)
    feature_select: str = opt("default", "default = patch features only; full = the CLS feature too (one more image "
                              "token)", choices=("default", "full"))


@dataclass
class LoraConfig:
    r: int = opt(8, "LoRA rank", min=1)
    alpha: float = opt(16.0, "LoRA scaling numerator: the adapter's update is (alpha / r) * B A", min=0.0)
    dropout: float = opt(0.0, "dropout on the adapter's input (training only)", min=0.0, max=1.0)
    target_modules: list = opt(None, "linear modules that get adapters (suffixes of module names; not lm_head or "
                               "embed_tokens: the chunked log-prob path reads the head's weight directly)",
                               factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"])


@dataclass
class ModelConfig:
    path: str | None = opt(None, "local Hugging Face model directory (from_pretrained), or a hub id org/name[@revision] "
                           "resolved through the hub cache (HF_HUB_OFFLINE=1: the cache alone; a run pins it to the "
                           "commit); null = build a tiny model")
    trust_remote_code: bool = opt(False, "run the Python code a model repository ships (transformers' "
                                  "trust_remote_code): only for repositories you trust", read_if="pretrained_model")
    arch: str = opt("qwen2", "architecture of a freshly built model (llava = a tiny CLIP vision tower + Qwen2: "
                    "model.vision)", choices=("qwen2", "llama", "llava"), read_if="fresh_model")
    hidden_size: int = opt(128, "hidden size of a freshly built model", min=8, read_if="fresh_model")
    intermediate_size: int = opt(512, "MLP size of a freshly built model", min=8, read_if="fresh_model")
    num_layers: int = opt(2, "layers of a freshly built model", min=1, read_if="fresh_model")
    num_heads: int = opt(4, "attention heads of a freshly built model", min=1, read_if="fresh_model")
    num_kv_heads: int = opt(2, "key/value heads of a freshly built model", min=1, read_if="fresh_model")
    max_position_embeddings: int = opt(512, "context length of a freshly built model (RoPE: no parameters)", min=8,
                                       read_if="fresh_model")
    dtype: str = opt("float32", "parameter dtype", choices=("float32", "bfloat16", "float16"))
    attn_implementation: str = opt("sdpa", "attention kernel", choices=("sdpa", "eager"))
    device: str = opt("cpu", "torch device (cpu, cuda, cuda:0, ...)")
    vision: VisionConfig = opt(None, "model.arch=llava: the vision tower of a freshly built model",
                               factory=lambda: VisionConfig(), read_if="llava")
    lora: LoraConfig | None = opt(None, "LoRA RL with PEFT (credo.models.lora, docs/lora.md): null = train all weights; "
                                  "a section {r, alpha, dropout, target_modules} = only adapters train")


@dataclass
class TaskConfig:
    name: str = opt("reversal", "built-in task (credo list tasks), 'file' for a JSONL/Parquet dataset, or 'hf' for a "
                    "dataset on the Hugging Face hub (task.dataset)")
    params: dict = opt(None, "task parameters, e.g. {min_len: 3, max_len: 6} (rg:<dataset>: the dataset's config "
                       "fields)", factory=dict)
    curriculum: dict | None = opt(None, "rg:<dataset> tasks: difficulty schedule {levels: [0, 1, 2], every: 50} (the "
                                  "dataset's curriculum levels, the next one every N prompt batches; optional mode: "
                                  "inclusive|upper_bound|last_k, k; docs/tasks.md)", read_if="rg_task")
    train_size: int = opt(4000, "generated training examples", min=1)
    eval_size: int = opt(200, "generated held-out examples", min=1)
    seed: int | None = opt(None, "data seed (null = run seed)")
    prompt_template: str = opt("{prompt}", "each prompt becomes this text with {prompt} replaced, e.g. "
                               "'What is {prompt}? Reply with the number only.'")
    chat_template: bool = opt(False, "wrap each prompt as a user message in the tokenizer's chat template "
                              "(pretrained instruct models)")
    train_file: str | None = opt(None, "JSONL/Parquet training file (task.name=file)")
    eval_file: str | None = opt(None, "JSONL/Parquet eval file; null = hold out eval_fraction of train_file")
    dataset: str | None = opt(None, "task.name=hf: hub dataset id org/name[@revision] (loaded with the datasets "
                              "library; HF_HUB_OFFLINE=1: from the caches alone)")
    subset: str | None = opt(None, "task.name=hf: the dataset's configuration (subset), e.g. main for openai/gsm8k")
    split: str = opt("train", "task.name=hf: the training split")
    eval_split: str | None = opt(None, "task.name=hf: the eval split; null = hold out eval_fraction of the training "
                                 "split (as for files)")
    streaming: bool | None = opt(None, "task.name=hf: stream the split instead of downloading it whole, reading its "
                                 "first train_size rows (eval_split: eval_size); null = stream when the dataset "
                                 "card says the split is over 1 GiB")
    answer_transform: str | None = opt(None, "file / hf rows: rewrite the answer field before use: gsm8k = the "
                                       "number after the last '####' (commas dropped), boxed = the content of the last "
                                       "\\boxed{...}; a row it cannot rewrite is a bad row",
                                       choices=("gsm8k", "boxed"))
    eval_fraction: float = opt(0.1, "held-out fraction when no eval_file is given", min=0.0, max=0.9,
                               read_if="file_or_hf_task")
    prompt_field: str = opt("prompt", "prompt field of file rows (a string or chat messages; a dotted path reaches "
                            "into nested objects)", read_if="file_or_hf_task")
    answer_field: str = opt("answer", "answer field of file rows (dotted path allowed: reward_model.ground_truth)",
                            read_if="file_or_hf_task")
    on_bad_row: str = opt("skip", "malformed file rows: skip (and count) or error", choices=("skip", "error"),
                          read_if="file_or_hf_task")
    max_bad_rows: int | None = opt(None, "fail when more rows than this are malformed", read_if="file_or_hf_task")
    max_row_bytes: int = opt(1 << 20, "file rows longer than this many bytes are bad rows (a JSONL line is never "
                             "read whole past it)", min=1, read_if="file_or_hf_task")


@dataclass
class VLLMConfig:
    mode: str = opt("inprocess", "inprocess = a vllm.LLM in the trainer's process; server = a vLLM OpenAI-compatible "
                    "server (given by url, or started by credo on 127.0.0.1)", choices=("inprocess", "server"))
    url: str | None = opt(None, "mode=server: base URL of a running vLLM server (started with VLLM_SERVER_DEV_MODE=1, "
                          "--logprobs-mode processed_logprobs, --weight-transfer-config "
                          "'{\"backend\": \"credo_torchdist\"}' or credo_safetensors; docs/vllm.md); null = credo "
                          "starts one", read_if="vllm_server")
    dtype: str = opt("auto", "vLLM's dtype (auto = the trainer's, model.dtype; vLLM's own auto would run a float32 "
                     "checkpoint in bfloat16)",
                     choices=("auto", "bfloat16", "float16", "float32"))
    gpu_memory_utilization: float = opt(0.4, "CUDA: share of the GPU's memory vLLM may take (weights + KV cache)",
                                        min=0.01, max=1.0, read_if="cuda")
    kv_cache_mb: int | None = opt(None, "KV-cache size in MiB (null = 512 on CPU; on CUDA gpu_memory_utilization "
                                  "decides)", min=1)
    max_model_len: int | None = opt(None, "longest prompt + response vLLM accepts (null = the model's context)", min=8)
    enforce_eager: bool | None = opt(None, "no graph compilation / CUDA graphs (null = on for CPU, where compiling "
                                     "costs ~30 s of start-up; off on CUDA)")
    sleep: bool = opt(False, "CUDA: vLLM sleeps between rollouts (level 1: weights to host memory, KV cache freed) so "
                      "the trainer has the GPU memory; the CPU build has no sleep mode", read_if="cuda")
    prefix_caching: bool = opt(True, "vLLM's automatic prefix caching: a request whose prompt starts with blocks "
                               "already computed reads their keys / values instead of prefilling them (agent turns "
                               "re-send their history; reset at every weight sync); metric agent/kv_reused_frac")
    startup_timeout_s: float = opt(600.0, "mode=server: how long credo waits for a server it started", min=1.0,
                                   read_if="vllm_server")
    request_timeout_s: float = opt(600.0, "mode=server: whole-call deadline of each request (connect to the reply's "
                                   "last byte; replies capped at 256 MiB)", min=1.0, read_if="vllm_server")
    server_concurrency: int = opt(64, "mode=server: requests in flight at once (the server batches them)", min=1,
                                  read_if="vllm_server")
    args: dict = opt(None, "extra vllm.LLM keyword arguments (mode=server: server flags, key -> --key)",
                     factory=dict)
    weight_sync: str = opt("auto", "how trained weights reach vLLM (docs/distributed.md, Weight sync): torchdist = a "
                           "gloo process group with vLLM's workers (rendezvous on 127.0.0.1), metadata in the request "
                           "and the tensors broadcast in buckets, only changed layers; safetensors = the tensors as "
                           "safetensors bytes inside the requests; nccl / ipc = vLLM's own CUDA engines (never run "
                           "here); auto = torchdist, or safetensors when the engine rejects it (a server given by url "
                           "started with the credo_safetensors backend)",
                           choices=("auto", "safetensors", "torchdist", "nccl", "ipc"))
    weight_sync_bucket_mb: int = opt(32, "weight_sync=torchdist / nccl / ipc: tensors per broadcast bucket, in MiB",
                                     min=1, read_if="vllm_buckets")
    weight_sync_timeout_s: float = opt(60.0, "weight_sync=torchdist: how long the rendezvous and each bucket may take "
                                       "before the sync fails", min=1.0, read_if="vllm_torchdist")
    weight_sync_only_changed: bool = opt(True, "weight_sync=torchdist: send only the decoder layers whose tensors "
                                         "changed since the last sync (a checksum per tensor, ~0.1 s per GB on a "
                                         "CPU thread; pure cost when every layer changes)", read_if="vllm_torchdist")


@dataclass
class RolloutConfig:
    group_size: int = opt(8, "samples per prompt (G)", min=1)
    temperature: float = opt(1.0, "sampling temperature", min=0.0)
    top_p: float = opt(1.0, "nucleus sampling mass", min=0.0, max=1.0)
    top_k: int = opt(0, "top-k sampling (0 = off)", min=0)
    max_new_tokens: int = opt(12, "response length cap", min=1)
    max_batch_size: int = opt(256, "sequences per generation batch", min=1)
    lean_decode: bool = opt(True, "Llama / Qwen2 models: decode through credo's lean loop on a preallocated KV "
                            "cache (credo.rollout.lean) instead of transformers' generic forward (also credo's HF engines beside "
                            "vLLM: the warm start's and credo sft's evaluation)")
    engine: str = opt("hf", "hf = credo's engine on the policy's device; vllm = a vLLM engine (its CPU build or "
                      "CUDA vLLM, in process or a server: rollout.vllm, docs/vllm.md)", choices=("hf", "vllm"))
    vllm: VLLMConfig = opt(None, "engine=vllm: how vLLM runs", factory=lambda: VLLMConfig(), read_if="vllm_engine")
    one_step_off: bool = opt(False, "asynchronous one-step-off-policy mode: step t+1's rollouts are generated "
                             "(by policy t) while step t's update runs; the lag is logged as rollout/policy_lag "
                             "(an alias of max_staleness: 1; true whenever max_staleness >= 1)")
    max_staleness: int = opt(0, "bounded-staleness async mode: generation runs up to K policy versions ahead of the "
                             "trainer (batch s sampled by policy max(0, s - K); 0 = on-policy, 1 = one_step_off; "
                             "docs/async.md)", min=0)
    partial: bool = opt(False, "max_staleness >= 1: partial rollouts; a batch's decoding takes each newer policy "
                        "at fixed decode steps (token d of batch s by policy s - K + d // ceil(max_new_tokens / K)), "
                        "each token's version and behaviour log-prob recorded (group collector, engine hf)",
                        read_if="async")
    partial_kv: str = opt("keep", "partial: at a weight switch keep the prefix's KV cache (computed by the older "
                          "policy) or recompute it with the new weights (a prefill of prompt + tokens so far)",
                          choices=("keep", "recompute"), read_if=('async', 'partial'))
    off_policy_ratio: str = opt("behaviour", "one_step_off: the PPO ratio's denominator; behaviour = the sampler's "
                                "log-probs (the policy that generated), recompute = the trainer's log-probs before "
                                "the update (decoupled PPO; pair with algo.rollout_correction)",
                                choices=("behaviour", "recompute"), read_if="async")
    collector: Any = choice("group", COLLECTORS, "how a step's rollouts are collected: group = single-turn groups "
                            "of group_size samples per prompt; tree = AttnRL tree rollouts; agent = multi-turn "
                            "episodes in environments; gateway = your own agent (a Python callable, a command, a "
                            "verifiers environment) against credo's OpenAI-compatible API")

    def __post_init__(self) -> None:
        # one_step_off is max_staleness 1; any max_staleness >= 1 is an asynchronous (one_step_off) run
        if self.one_step_off and not self.max_staleness:
            self.max_staleness = 1
        self.one_step_off = self.one_step_off or self.max_staleness >= 1


@dataclass
class GroupCollectorConfig:
    type: str = type_key("group", "single-turn groups: rollout.group_size samples per prompt, scored by the verifier")
    filter_groups: bool = opt(False, "drop groups whose rewards are all equal (Archer / ASPO rejection sampling)")
    dynamic_sampling: bool = opt(False, "DAPO: refill dropped groups by generating more, up to max_gen_batches")
    max_gen_batches: int = opt(3, "generation rounds per step allowed by dynamic_sampling", min=1,
                               read_if="dynamic_sampling")


@dataclass
class NoSelectConfig:
    type: str = type_key("none", "the policy loss credits every response token")


@dataclass
class EntropySelectConfig:
    type: str = type_key("entropy", "train only on the highest-entropy response tokens (forking tokens)")
    top_fraction: float = opt(0.2, "share of the batch's response tokens kept, by entropy (the 80/20 rule: 0.2)",
                          min=0.0, max=1.0)


@dataclass
class RewardConfig:
    name: str | None = opt(None, "verifier (credo list rewards) or module:function; null = the task's default")
    kwargs: dict = opt(None, "keyword arguments for the verifier", factory=dict)
    timeout_s: float = opt(5.0, "per-response verifier time limit (process executor)", min=0.01)
    failure_score: float = opt(0.0, "score of a response whose verifier raised or timed out")
    workers: int = opt(2, "verifier worker processes", min=1)
    executor: str = opt("auto", "process (isolated, hard timeouts), inline (in-process), or auto = inline for "
                        "verifiers registered inline_safe (exact_match, number), process otherwise",
                        choices=("auto", "process", "inline"))
    overlong_buffer: int = opt(0, "DAPO soft overlong penalty over the last N tokens before max_new_tokens (0 = off)",
                               min=0)
    overlong_penalty: float = opt(1.0, "penalty at max_new_tokens for overlong_buffer", min=0.0, read_if="overlong")
    by_data_source: dict = opt(None, "per-row verifiers: rows whose data_source column is a key are scored by its "
                               "verifier, e.g. {openai/gsm8k: math, countdown: {name: countdown, kwargs: {use_all: "
                               "false}}}; other rows by reward.name",
                               factory=dict)
    weight: float = opt(1.0, "weight of the task verifier's score when reward.mix adds components")
    mix: list = opt(None, "extra reward components summed with the verifier's score, e.g. [{name: reward_model, "
                    "weight: 0.5, kwargs: {path: RUN/reward_model}}] (accuracy still from the verifier)", factory=list)
    noise: float = opt(0.0, "share of training rewards corrupted (robustness experiments; evaluation stays clean)",
                       min=0.0, max=1.0)
    noise_mode: str = opt("flip", "flip: s -> 2 * noise_center - s (1 - s for 0/1 rewards); perturb: s + N(0, "
                          "noise_std^2)", choices=("flip", "perturb"), read_if="reward_noise")
    noise_center: float = opt(0.5, "flip noise: the value scores are mirrored around",
                              read_if=('reward_noise', 'noise_flip'))
    noise_std: float = opt(1.0, "perturb noise: standard deviation", min=0.0, read_if=('reward_noise', 'noise_perturb'))


@dataclass
class AlgoConfig:
    advantage: str = opt("grpo", "advantage estimator (credo list estimators)")
    advantage_args: dict = opt(None, "estimator hyperparameters", factory=dict)
    policy_loss: str = opt("ppo", "per-token policy loss (credo list losses)")
    policy_loss_args: dict = opt(None, "loss hyperparameters, e.g. {clip_high: 0.28}", factory=dict)
    agg: str = opt("token-mean", "loss aggregation", choices=(
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "constant-norm"))
    loss_scale_factor: float | None = opt(None, "divisor for seq-mean-token-sum-norm (null = rollout.max_new_tokens)",
                                          read_if="seq_norm")
    kl_coef: float = opt(0.0, "KL coefficient against the frozen reference (0 = no reference model)", min=0.0)
    kl_estimator: str = opt("k3", "KL estimator: k1, abs, k2, k3 (+ suffix = straight-through)", read_if="kl")
    kl_in_reward: bool = opt(False, "subtract kl_coef * KL_t from each token's reward (as verl) instead of adding it "
                                 "to the loss", read_if="kl")
    entropy_coef: float = opt(0.0, "entropy bonus coefficient (loss -= coef * agg(entropy))")
    rollout_correction: str = opt("auto", "importance weights for the sampler-trainer mismatch, exp(old_logprobs - "
                                  "rollout_logprobs) per token or per sequence, truncated or masked to [rollout_is_low, "
                                  "rollout_is_high] (credo.algo.rollout_correction); auto = token_truncate with "
                                  "rollout.engine=vllm (engine and trainer differ), none with hf",
                                  choices=("auto", "none", "token_truncate", "token_mask", "sequence_truncate",
                                           "sequence_mask"))
    rollout_is_low: float | None = opt(None, "lower bound of the rollout-correction weights (null = none)",
                                       read_if="rollout_correction")
    rollout_is_high: float = opt(2.0, "upper bound of the rollout-correction weights (verl 2.0, TRL 3.0)", min=0.0,
                                 read_if="rollout_correction")
    sft_coef: float = opt(0.0, "weight of an NLL term on fully correct responses (GPPO / CE-GPPO recipes: 0.1)",
                          min=0.0)
    sft_correct_score: float = opt(1.0, "score that marks a response as fully correct for sft_coef", read_if="sft_term")



@dataclass
class CriticConfig:
    enabled: bool | None = opt(None, "train a critic (value model); null = when the advantage estimator needs values")
    path: str | None = opt(None, "saved critic directory to start from; null = initialise from the policy backbone",
                           read_if="critic")
    lr: float = opt(1e-3, "critic AdamW learning rate", min=0.0, read_if="critic")
    weight_decay: float = opt(0.0, "critic AdamW weight decay", min=0.0, read_if="critic")
    grad_clip: float = opt(1.0, "critic max gradient norm (0 = off)", min=0.0, read_if="critic")
    head: str = opt("scalar", "value head: scalar (PPO), quantile (DVPO's N x M quantile ensemble), vib (VRPO's "
                    "information bottleneck) or flow (DFPO's value-flow field)",
                    choices=("scalar", "quantile", "vib", "flow"), read_if="critic")
    head_args: dict = opt(None, "head shape: quantile {heads: 3, quantiles: 200}; vib {z_dim: 32}; flow {proj_dim: "
                          "64, hidden: 64, layers: 2, flows: 1, time_embed: raw, quantiles: 32, quantile_steps: 10, "
                          "value_readout: euler1_mean, return_clip: null}", factory=dict, read_if="critic")
    loss: str = opt("clipped_mse", "critic loss (credo list critic_losses): clipped_mse, dvpo (quantile head, "
                    "algo.advantage=dvpo), vrpo (vib head) or dfpo (flow head, algo.advantage=dfpo)", read_if="critic")
    loss_args: dict = opt(None, "critic loss hyperparameters, e.g. {cliprange_value: 0.5}", factory=dict,
                          read_if="critic")
    pretrain_steps: int = opt(0, "RL steps at the start that train only the critic, the policy frozen (verl "
                              "critic_warmup; not a learning-rate warm-up)", min=0, read_if="critic")


@dataclass
class TrainConfig:
    steps: int = opt(200, "RL steps (one rollout batch each)", min=0)
    budget: str = opt("steps", "what ends the run: steps (train.steps), or the first step at which the run's total "
                      "of sampled_tokens (response tokens the engine generated, filtered or not), trained_tokens "
                      "(response tokens in the update batches) or wall_s (RL wall seconds) reaches "
                      "train.budget_value; train.steps stays an upper bound (credo compare's matched budgets, "
                      "docs/evidence.md)", choices=("steps", "sampled_tokens", "trained_tokens", "wall_s"))
    budget_value: float = opt(0.0, "the train.budget total that ends the run", min=0.0, read_if="budget")
    prompts_per_step: int = opt(16, "prompts per step; sequences = prompts_per_step * group_size", min=1)
    ppo_epochs: int = opt(1, "passes over each rollout batch", min=1)
    mini_batch_size: int | None = opt(None, "sequences per optimizer step (null = whole batch)", min=1)
    micro_batch_size: int | None = opt(None, "sequences per forward/backward (gradient accumulation)", min=1)
    micro_batch_tokens: int | None = opt(None, "token budget per forward/backward instead of a sequence count: "
                                         "consecutive sequences up to this many real tokens (null = off)", min=1)
    old_logprob_pass: str = opt("auto", "a separate no-grad pass for old_logprobs: always, or auto = skip it when "
                                "each rollout batch gets exactly one optimizer step and nothing else reads it (then "
                                "old_logprobs = the update's own log-probs, detached: ratio 1, as TRL with "
                                "num_iterations=1)", choices=("auto", "always"))
    skip_zero_advantage: bool = opt(True, "leave rows whose advantages are all zero out of the update's forward / "
                                    "backward when nothing gives them a gradient (exact: the loss normalisers still "
                                    "count them; the policy loss must declare it, and kl_coef (as a loss), "
                                    "entropy_coef and sft_coef must be 0)")
    share_prompt: bool = opt(True, "forward each distinct prompt once per micro-batch and run its G responses on "
                             "its keys and values (exact; the padded path, not used when pack is on)")
    pack_responses: bool = opt(True, "with share_prompt: the responses run packed into rows of pack_row_tokens "
                               "(null = the longest response) on their prompts' keys and values, with a block mask, "
                               "instead of padded to the longest response (exact; credo.train.shared_pack)")
    pack: bool = opt(False, "padding-free forward: pack sequences into dense rows (position-id restarts)")
    pack_row_tokens: int | None = opt(None, "tokens per packed row; null = the longest sequence of the micro-batch "
                                      "(on the CPU attention costs row_tokens^2 per row, so longer rows lose)", min=1,
                                      read_if="packing")
    logprob_chunk_size: int | None = opt(None, "tokens per chunk of the log-prob / entropy computation from hidden "
                                         "states (memory O(chunk * vocab)); null = 2^26 / vocab; 0 = materialise "
                                         "the full (B, T, V) logits", min=0)
    activation_checkpointing: bool = opt(False, "recompute each decoder layer's activations in the backward pass "
                                         "instead of keeping them (transformers' per-layer gradient checkpointing, "
                                         "non-reentrant): activation memory ~ the layers' inputs + one layer's "
                                         "activations, for about one more forward of compute; same gradients. The "
                                         "update's forward then runs each prompt per row, not the shared-prompt "
                                         "forward (share_prompt; no-grad passes still use it) (docs/performance.md)")
    mixed_precision: str = opt("none", "bf16 = the policy's forward and backward compute in bfloat16 (autocast; "
                               "with distributed.strategy=fsdp2 FSDP2's MixedPrecisionPolicy, gradients reduced in "
                               "float32) with float32 master weights, gradients and optimizer state "
                               "(model.dtype=float32); log-probs stay float32. fp16 = float16 autocast with loss "
                               "scaling (torch GradScaler; not with fsdp2); the critic computes in float32 "
                               "(docs/performance.md)",
                               choices=("none", "bf16", "fp16"))
    optimizer_offload: bool = opt(False, "keep the policy's AdamW state (and its float32 master weights) in host "
                                  "memory: gradients copied to the CPU, the step run there, the weights copied "
                                  "back (ZeRO-Offload style, credo.train.offload); with distributed.strategy=fsdp2 "
                                  "FSDP2's CPUOffloadPolicy (sharded parameters, gradients and optimizer state on "
                                  "the host). Same updates; saves 8 bytes per parameter of device memory for "
                                  "host-device copies every step (docs/performance.md)")
    lr: float = opt(3e-4, "AdamW learning rate", min=0.0)
    weight_decay: float = opt(0.0, "AdamW weight decay", min=0.0)
    betas: list = opt(None, "AdamW betas", factory=lambda: [0.9, 0.99])
    grad_clip: float = opt(1.0, "max gradient norm (0 = off); a non-finite norm skips the step", min=0.0)
    warmup_steps: int = opt(5, "linear learning-rate warm-up (optimizer steps)", min=0)
    lr_schedule: str = opt("constant", "after warm-up", choices=("constant", "cosine", "linear"))
    min_lr_ratio: float = opt(0.1, "final lr / lr for cosine and linear", min=0.0, max=1.0, read_if="lr_decay")
    threads: int | None = opt(None, "torch CPU threads (null = torch default)", min=1)
    reuse_host_memory: bool = opt(True, "keep freed host memory in the process for the next step (glibc malloc: "
                                  "no mmap'd blocks, no heap trimming; credo.train.host_memory): a step no longer "
                                  "faults its large tensors in afresh; the process keeps its peak heap")


@dataclass
class WarmStartConfig:
    enabled: bool | None = opt(None, "SFT before RL: true, false, or null = only for a freshly built model")
    steps: int = opt(100, "SFT optimizer steps", min=0, read_if="warm_start")
    batch_size: int = opt(32, "demonstrations per SFT step", min=1, read_if="warm_start")
    lr: float = opt(3e-3, "SFT learning rate", min=0.0, read_if="warm_start")
    warmup_steps: int = opt(5, "SFT lr warm-up steps", min=0, read_if="warm_start")


@dataclass
class EvalConfig:
    every: int = opt(25, "evaluate every N RL steps (0 = only before and after RL)", min=0)
    size: int | None = opt(None, "held-out examples to evaluate (null = all)", min=1)
    k: int = opt(4, "samples per prompt for avg@k / pass@k", min=1)
    temperature: float = opt(1.0, "sampling temperature for avg@k", min=0.0)
    pass_k: list = opt(None, "also report eval/pass@j for each j here (each <= k), the unbiased estimator "
                       "of Chen et al. 2021 over the k samples, e.g. [1, 5]", factory=list)


@dataclass
class CheckpointConfig:
    every: int = opt(50, "checkpoint every N steps (0 = only at the end)", min=0)
    keep: int = opt(2, "checkpoints to keep (older ones are deleted)", min=1)
    save_final: bool = opt(True, "save the final policy as a Hugging Face directory in RUN_DIR/final")
    on_signal: bool = opt(True, "on SIGTERM / SIGUSR1 (a scheduler's preemption notice) finish the step, write a "
                          "checkpoint and exit with code 75 (docs/security.md); false: stop at once as before")


@dataclass
class WandbConfig:
    project: str = opt("credo", "W&B project")
    entity: str | None = opt(None, "W&B entity (user or team); null = the account's default")
    name: str | None = opt(None, "W&B run name; null = the run directory's name")
    mode: str = opt("auto", "auto = $WANDB_MODE if set, else online when an API key is found ($WANDB_API_KEY or "
                    "`wandb login`), else offline (no network; upload later with `wandb sync`)",
                    choices=("auto", "online", "offline"))
    dir: str | None = opt(None, "folder wandb writes its files under (DIR/wandb); null = RUN_DIR")
    group: str | None = opt(None, "W&B run group")
    tags: list = opt(None, "W&B run tags", factory=list)


@dataclass
class MlflowConfig:
    tracking_uri: str | None = opt(None, "MLflow tracking URI (a server http://..., sqlite:///PATH, ...); null = "
                                   "$MLFLOW_TRACKING_URI if set, else the local store sqlite:///RUN_DIR/mlflow.db")
    experiment: str = opt("credo", "MLflow experiment name (created if missing)")
    run_name: str | None = opt(None, "MLflow run name; null = the run directory's name")


@dataclass
class TrackioConfig:
    project: str = opt("credo", "trackio project")
    name: str | None = opt(None, "trackio run name; null = the run directory's name")
    dir: str | None = opt(None, "trackio's local store (sets $TRACKIO_DIR before trackio is imported); null = "
                          "trackio's own ($TRACKIO_DIR or ~/.cache/huggingface/trackio)")


@dataclass
class LogConfig:
    trackers: list = opt(None, "experiment trackers that also get every metric and the resolved config: any of "
                         "wandb, mlflow, trackio, e.g. [wandb, mlflow] (docs/tracking.md)", factory=list)
    wandb: WandbConfig = opt(None, "Weights & Biases settings (log.trackers has wandb)", factory=WandbConfig,
                             read_if="wandb")
    mlflow: MlflowConfig = opt(None, "MLflow settings (log.trackers has mlflow)", factory=MlflowConfig,
                               read_if="mlflow")
    trackio: TrackioConfig = opt(None, "trackio settings (log.trackers has trackio)", factory=TrackioConfig,
                                 read_if="trackio")
    tensorboard: bool = opt(True, "write TensorBoard events to RUN_DIR/tb")
    progress: bool = opt(True, "live progress bar (plain lines when not a terminal)")
    print_every: int = opt(10, "plain-text progress line every N steps when not a terminal", min=1)
    report: bool = opt(True, "write report.html and plots at the end")
    mechanism: bool = opt(False, "log method-blind mechanism diagnostics (mech/*: where the policy gradient goes, "
                          "by clip region, entropy and probability; docs/algorithms/README.md, \"Mechanism diagnostics\")")
    rollouts_every: int = opt(0, "dump every N-th step's training samples (tokens, loss mask, advantages, turns, "
                              "text, reward) to RUN_DIR/rollouts.jsonl; 0 = off", min=0)


@dataclass
class DistributedConfig:
    backend: str = opt("none", "none (one process); torchrun: data-parallel updates over torch.distributed, one "
                       "process per rank started by `torchrun --nproc-per-node N --no-python credo train ...`; "
                       "ray: Ray places world_size trainer ranks, rollout_workers engines and reward_workers "
                       "verifier workers (docs/distributed.md)",
                       choices=("none", "torchrun", "ray"))
    comm: str = opt("auto", "torch.distributed backend: gloo, nccl, or auto = nccl with CUDA, else gloo",
                    choices=("auto", "gloo", "nccl"), read_if="multi_rank")
    rollout: str = opt("shard", "torchrun mode: shard = each rank generates and scores its share of the prompts "
                       "and the ranks exchange them; replicate = every rank generates the whole batch (same as one "
                       "process, token for token). Agent episodes and rollout.collector.filter_groups always replicate",
                       choices=("shard", "replicate"), read_if="torchrun")
    strategy: str = opt("ddp", "data-parallel training of the policy: ddp = every rank holds the whole model and "
                        "the gradients are summed; fsdp2 = parameters, gradients and optimizer state sharded over the "
                        "ranks (torch FSDP2; no shared-prompt forward; checkpoints hold the shards via torch.distributed.checkpoint "
                        "and resume on the same or another number of ranks, docs/distributed.md)", choices=("ddp", "fsdp2"),
                        read_if="multi_rank")
    world_size: int = opt(1, "ray mode: data-parallel trainer ranks (Ray actors joined by torch.distributed)", min=1)
    rollout_workers: int = opt(1, "ray mode: rollout engine actors, each with a policy copy synced after every "
                               "update", min=1, read_if="ray")
    reward_workers: int = opt(1, "ray mode: verifier actors the reward batches are split over", min=1, read_if="ray")
    ray_address: str | None = opt(None, "ray mode: null = start a private local Ray instance for the run (bound to "
                                  "127.0.0.1); auto = join the running cluster (`ray start --head`); or HOST:PORT",
                                  read_if="ray")
    ray_connect_timeout_s: float = opt(30.0, "ray mode: seconds to reach ray_address before failing with a one-line "
                                       "error (exit code 2)", min=0.1, read_if="ray")
    worker_cpus: float = opt(1.0, "ray mode: CPUs each actor reserves (trainer ranks, rollout and reward workers)",
                             min=0.0, read_if="ray")
    ray_placement: str = opt("default", "ray mode: where Ray places the actors; default = Ray's default scheduling "
                             "(fills a node before the next); spread = each kind of actor (trainer ranks, rollout "
                             "workers, reward workers) spread over the nodes (Ray's SPREAD strategy)",
                             choices=("default", "spread"), read_if="ray")
    trainer_gpus: float = opt(0.0, "ray mode: GPUs each trainer rank reserves", min=0.0, read_if="ray")
    rollout_gpus: float = opt(0.0, "ray mode: GPUs each rollout worker reserves", min=0.0, read_if="ray")
    inject_faults: list = opt(None, "testing aid, ray mode: KIND:WORKER:CALL entries (KIND rollout or reward) "
                              "that make that worker's process exit at the start of its CALL-th call", factory=list)


GUARD_MODES = ("error", "warn", "off")  # a runtime guard's modes (credo.guards)


@dataclass
class GuardsConfig:
    weight_sync: str = opt("error", "after every weight sync the engine must serve the trained weights (LoRA "
                           "adapters included): error, warn or off", choices=GUARD_MODES)
    finite_logprobs: str = opt("error", "every sampled token must have a finite behaviour log-prob (no zero-filling)",
                               choices=GUARD_MODES)
    first_ratio: str = opt("warn", "on an on-policy step the ratio exp(logprobs - rollout_logprobs) of the first "
                           "mini-batch must be 1 within ratio_tol (trainer / engine mismatch; warn: vLLM in bf16 "
                           "deviates legitimately)", choices=GUARD_MODES)
    ratio_tol: float = opt(1e-3, "first_ratio: largest allowed mean abs(ratio - 1) over the first mini-batch's loss "
                           "tokens (credo's HF engine in float32: ~1e-7; raise it for a bf16 engine)", min=0.0,
                           read_if="first_ratio_guard")
    weight_tol: float = opt(1e-5, "weight_sync: largest allowed relative difference of the weight fingerprints "
                            "(the engine may hold the weights in another dtype)", min=0.0, read_if="weight_sync_guard")
    probe_tol: float | None = opt(None, "weight_sync on engines without a fingerprint (vLLM): largest allowed mean "
                                  "abs difference of a fixed probe's log-probs, engine vs trainer; null = 1e-3 for "
                                  "a float32 engine (measured ~1e-7), 1e-2 for a 16-bit or auto one (bf16: ~2e-3; "
                                  "docs/guards.md)", min=0.0, read_if=('weight_sync_guard', 'vllm_engine'))
    tool_calls: str = opt("warn", "tool runs: a step in which the model attempted no tool call", choices=GUARD_MODES)
    env_failures: str = opt("warn", "agent runs: a step with episodes the environment failed on (they are left out "
                            "of the update, never trained on as empty steps)", choices=GUARD_MODES)



@dataclass
class RunConfig:
    seed: int = opt(0, "global seed")
    output_dir: str = opt("runs", "parent directory of run directories")
    run_name: str | None = opt(None, "run directory name (null = TASK-LOSS-TIMESTAMP)")
    plugins: list = opt(None, "modules imported before the config is checked, to register environments, AgentGym "
                        "adapters, rewards or tasks (the working directory is searched first; --plugin M adds one)",
                        factory=list)
    model: ModelConfig = opt(None, factory=ModelConfig)
    task: TaskConfig = opt(None, factory=TaskConfig)
    rollout: RolloutConfig = opt(None, factory=RolloutConfig)
    reward: RewardConfig = opt(None, factory=RewardConfig)
    algo: AlgoConfig = opt(None, factory=AlgoConfig)
    train: TrainConfig = opt(None, factory=TrainConfig)
    critic: CriticConfig = opt(None, factory=CriticConfig)
    warm_start: WarmStartConfig = opt(None, factory=WarmStartConfig)
    eval: EvalConfig = opt(None, factory=EvalConfig)
    checkpoint: CheckpointConfig = opt(None, factory=CheckpointConfig)
    log: LogConfig = opt(None, factory=LogConfig)
    distributed: DistributedConfig = opt(None, factory=DistributedConfig)
    guards: GuardsConfig = opt(None, "runtime guards (credo.guards): each error | warn | off, counted as "
                               "guard/<name>_trips", factory=GuardsConfig)
    token_select: Any = choice("none", TOKEN_SELECTORS, "which response tokens the policy loss credits: none = all, "
                               "entropy = the top-entropy forking tokens, vepo = VEPO's grounding-sensitive ones")
    replay: Any = section("credo.methods.rlep.config:ReplayConfig", "RLEP experience replay (credo.methods.rlep): "
                          "null = off, or a section with replay.pool")
    distill: Any = section("credo.methods.distill.config:DistillConfig", "on-policy distillation "
                           "(credo.methods.distill): null = off, or a section with distill.teacher.path")
    ext: dict = opt(None, "plugin methods' sections by name, e.g. ext.my_method.coef=0.1: each is checked against "
                    "the dataclass its plugin registered (credo.config.ext; docs/extending.md)", factory=dict)
