"""A :class:`~credo.rollout.RolloutEngine` backed by vLLM (GPU): ``rollout.engine=vllm``.

NOT RUN IN THIS PROJECT YET: the machines it was written on have no GPU, and vLLM needs one. It follows vLLM's
offline ``LLM`` API as of 0.1x-0.3x (the API TRL 1.16's colocate mode uses); ``tests/test_vllm_gpu.py`` checks
generation, log-prob agreement with the trainer and weight sync, and is skipped where CUDA or vLLM is missing.

- Sampling: vLLM's ``SamplingParams`` (``n`` per prompt, temperature, top-p, top-k, ``max_tokens``, stop token
  ids), one seed per call drawn from the engine's seeded generator (or ``sampling.seed``), so a run is
  reproducible for a given vLLM build, but its tokens are not the HF engine's.
- Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"`` (after temperature), so the
  sampled token's log-prob is the one the trainer recomputes at the same temperature. Where top-k / top-p are
  on, vLLM's processed log-probs are taken after that filtering (renormalised over the kept tokens) while the
  trainer's are not; ``rollout/logprob_abs_diff`` shows the gap and ``algo.rollout_correction`` corrects for it.
  ``top_logprobs=k`` (ARPO / AEPO) asks vLLM for the k most likely tokens at each position.
- Stops: a response that ends with EOS or a stop id keeps it as its last token (as the HF engine does);
  ``stop_sequences`` are passed as vLLM stop strings decoded from the token ids.
- Temporary model folder: :meth:`from_model` saves the in-memory policy to a ``credo-vllm-*`` folder for vLLM to
  load; the engine owns it and deletes it on :meth:`close`, when it is garbage-collected or at interpreter exit
  (``weakref.finalize``), and at once if the engine fails to start.
- Weights: :meth:`update_weights` loads a module's (or a state dict's) tensors into vLLM's model in every worker
  through ``LLM.apply_model`` (the model's own ``load_weights``), then resets the prefix cache. The tensors travel
  by inter-process messaging: simple and slow; a CUDA-IPC or NCCL path is future work.
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
from credo.types import Example, SamplingParams, Trajectory


class VLLMUnavailable(ValueError):
    """rollout.engine=vllm on a machine without a CUDA GPU or without vLLM."""


def vllm_problem() -> str | None:
    """Why vLLM cannot run here (not installed, no CUDA GPU, fails to import), or None when it can."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install vllm)"
    if not torch.cuda.is_available():
        return f"no CUDA GPU is available to torch {torch.__version__}"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install raises more than ImportError
        return f"import vllm failed ({type(exc).__name__}: {exc})"
    return None


def vllm_available() -> bool:
    return vllm_problem() is None


class VLLMRolloutEngine:
    """See the module docstring. ``model_path``: a Hugging Face directory vLLM loads the architecture (and the
    initial weights) from; :func:`from_model` writes one for a model built in memory."""

    def __init__(self, model_path: str | Path, tokenizer: Any, *, seed: int = 0, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.4, max_model_len: int | None = None,
                 llm_kwargs: dict[str, Any] | None = None) -> None:
        from transformers import AutoConfig
        from vllm import LLM

        self.tokenizer = tokenizer
        self.model_config = AutoConfig.from_pretrained(model_path)
        self.llm = LLM(model=str(model_path), tokenizer=str(model_path), seed=seed, dtype=dtype,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                       logprobs_mode="processed_logprobs", **(llm_kwargs or {}))
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.policy_version = 0
        self.eos_id = tokenizer.eos_token_id
        self._cleanup: weakref.finalize | None = None  # removes a temporary model folder (from_model)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, **kwargs: Any) -> "VLLMRolloutEngine":
        """An engine for a model held in memory, saved to a temporary folder for vLLM to load; the folder is
        deleted with the engine (module docstring), or here if saving or starting the engine fails."""
        path = Path(tempfile.mkdtemp(prefix="credo-vllm-"))
        try:
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            engine = cls(path, tokenizer, **kwargs)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        engine._cleanup = weakref.finalize(engine, shutil.rmtree, str(path), ignore_errors=True)
        return engine

    # -------------------------------------------------------------- protocol

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams,
                 on_done: OnDone | None = None) -> list[Trajectory]:
        prompt_ids = [encode_prompt(self.tokenizer, ex.prompt) for ex in prompts]
        outs = self._run(prompt_ids, self._params(sampling, n=n))
        trajs = []
        for g, (ex, ids, req) in enumerate(zip(prompts, prompt_ids, outs)):
            for comp in req.outputs:
                cont = self._continuation(comp, top_k=0)
                ended = cont.finish_reason == "stop"
                text_ids = cont.ids[:-1] if ended and cont.ids and cont.ids[-1] == self.eos_id else cont.ids
                trajs.append(Trajectory(
                    example=ex, group_id=g, prompt_ids=ids, response_ids=cont.ids, rollout_logprobs=cont.logprobs,
                    response_mask=[1] * len(cont.ids), finish_reason="eos" if ended else "length",
                    response_text=self.tokenizer.decode(text_ids, skip_special_tokens=True),
                    policy_version=self.policy_version))
        if on_done is not None:
            for i, t in enumerate(trajs):
                on_done(i, t)
        return trajs

    def continue_ids(self, prefixes: list[list[int]], sampling: SamplingParams, *, stop_ids: tuple[int, ...] = (),
                     top_logprobs: int = 0, stop_sequences: tuple[tuple[int, ...], ...] = (),
                     on_finish: Callable[[int, Continuation], None] | None = None) -> list[Continuation]:
        params = self._params(sampling, n=1, stop_ids=stop_ids, top_logprobs=top_logprobs,
                              stop=[self.tokenizer.decode(list(q)) for q in stop_sequences if q])
        out = [self._continuation(req.outputs[0], top_k=top_logprobs) for req in self._run(prefixes, params)]
        if on_finish is not None:
            for i, c in enumerate(out):
                on_finish(i, c)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def update_weights(self, weights: torch.nn.Module | dict[str, torch.Tensor], *, version: int) -> None:
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        named = [(k, v.detach().to("cpu")) for k, v in state.items()]
        self.llm.apply_model(lambda model: model.load_weights(iter(named)))
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def close(self) -> None:
        """Release vLLM and delete the temporary model folder, if any (idempotent)."""
        self.__dict__.pop("llm", None)
        if self._cleanup is not None:
            self._cleanup()

    # -------------------------------------------------------------- internals

    def _params(self, sp: SamplingParams, *, n: int, stop_ids: tuple[int, ...] = (), top_logprobs: int = 0,
                stop: list[str] | None = None):
        from vllm import SamplingParams as VParams

        gen = self.generator if sp.seed is None else torch.Generator(device="cpu").manual_seed(sp.seed)
        greedy = sp.greedy or sp.temperature == 0
        return VParams(n=n, temperature=0.0 if greedy else sp.temperature, top_p=sp.top_p,
                       top_k=sp.top_k if sp.top_k > 0 else -1, max_tokens=sp.max_new_tokens,
                       seed=draw_key(gen) % (2**31 - 1), logprobs=max(top_logprobs, 0),
                       stop_token_ids=list(stop_ids), stop=stop or None, include_stop_str_in_output=True,
                       skip_special_tokens=False)

    def _run(self, prefixes: list[list[int]], params) -> list[Any]:
        return self.llm.generate([{"prompt_token_ids": list(p)} for p in prefixes], params, use_tqdm=False)

    def _continuation(self, comp: Any, *, top_k: int) -> Continuation:
        ids = list(comp.token_ids)
        steps = comp.logprobs or []
        logprobs = [float(entry[tok].logprob) for entry, tok in zip(steps, ids)]
        tops = None
        if top_k:
            tops = torch.full((len(ids), top_k), float("-inf"))
            for t, entry in enumerate(steps[: len(ids)]):
                best = sorted((float(lp.logprob) for lp in entry.values()), reverse=True)[:top_k]
                tops[t, : len(best)] = torch.tensor(best)
        return Continuation(ids=ids, logprobs=logprobs, top_logprobs=tops,
                            finish_reason="stop" if comp.finish_reason == "stop" else "length")
