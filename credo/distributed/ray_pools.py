"""Ray-placed rollout engines and reward workers, behind the interfaces the recipe already uses.

:class:`RolloutPool` is a :class:`~credo.rollout.RolloutEngine` whose ``generate`` / ``continue_ids`` split the
prompts over N Ray actors, each holding its own copy of the policy (:class:`RolloutWorker`, an
:class:`~credo.rollout.HFRolloutEngine`). The pool draws one sampling key per call from its own seeded generator
and hands each worker ``(key, first_row)`` of its share, so the pool samples token for token what one engine with
the same seed samples (:func:`credo.rollout.hf.uniform_draws`), whatever the number of workers.
:meth:`RolloutPool.update_weights` ships the trainer's weights (one ``ray.put``, read by every worker) with a policy
version that every trajectory then records.

:class:`RewardPool` has the :class:`~credo.rewards.RewardRunner` interface (``score``) and splits each batch over M
actors, each with its own runner (so a sandboxing verifier's process pool runs on every reward worker).

Both recover from a worker that dies mid-call (process killed, node lost): the actor is replaced (a rollout
worker gets the current weights and version first), the dead worker's share is re-queued on the replacement, the
call completes, and ``restarts`` counts it (logged by the recipe as ``dist/rollout_restarts`` /
``dist/reward_restarts``). ``faults`` injects deaths for tests: ``{worker_index: call_number}`` makes that worker
exit (``os._exit``) at the start of its n-th call; replacements never inherit it.

The actors are not detached: Ray ends them when the driver exits or is killed, and a reward actor's verifier
workers die with the actor (:mod:`credo.procs`).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from credo.rollout.hf import HFRolloutEngine, draw_key
from credo.types import Example, RewardResult, SamplingParams, Trajectory

log = logging.getLogger(__name__)


def _ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised where ray is absent
        raise ImportError("distributed.backend=ray needs Ray: pip install 'credo[distributed]' (ray>=2.40)") from exc
    return ray


# ============================================================================ worker actors (plain classes;
# ray.remote wraps them at spawn time, so importing this module does not need Ray)

class _Crashable:
    def _arm(self, crash_on_call: int | None) -> None:
        self._calls = 0
        self._crash_on_call = crash_on_call

    def _count_call(self) -> None:
        self._calls += 1
        if self._crash_on_call is not None and self._calls == self._crash_on_call:
            os._exit(1)  # an injected fault: the process dies mid-call, as a killed worker would


class RolloutWorker(_Crashable):
    """One rollout engine in its own process: a policy copy built from the trainer's model config."""

    def __init__(self, model_config: Any, tokenizer: Any, *, dtype: torch.dtype, max_batch_size: int, lean: bool,
                 threads: int, crash_on_call: int | None = None) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(max(threads, 1))
        model = AutoModelForCausalLM.from_config(model_config, dtype=dtype)
        self.engine = HFRolloutEngine(model, tokenizer, max_batch_size=max_batch_size, lean=lean)
        self._arm(crash_on_call)

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        self.engine.model.load_state_dict(state)
        self.engine.policy_version = version
        return version

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams,
                 stream: tuple[int, int]) -> list[Trajectory]:
        self._count_call()
        return self.engine.generate(prompts, n, sampling, stream=stream)

    def weights_fingerprint(self) -> Any:
        """The served weights' fingerprint (the weight_sync guard, credo.guards.weights)."""
        from credo.guards.weights import weights_fingerprint

        return weights_fingerprint(self.engine.model)

    def continue_ids(self, prefixes: list[list[int]], sampling: SamplingParams, kwargs: dict[str, Any],
                     stream: tuple[int, int]) -> list[Any]:
        self._count_call()
        return self.engine.continue_ids(prefixes, sampling, stream=stream, **kwargs)


class VLLMRolloutWorker(RolloutWorker):
    """One vLLM engine (in process, :class:`~credo.rollout.vllm_engine.VLLMRolloutEngine`) in its own actor: it
    starts on the architecture with freshly initialised weights, saved to its own temporary folder (so it needs
    nothing from the driver's disk), and serves the trainer's weights from the pool's first sync on."""

    def __init__(self, model_config: Any, tokenizer: Any, *, dtype: torch.dtype, options: Any, seed: int,
                 threads: int, scratch: str, crash_on_call: int | None = None) -> None:
        from transformers import AutoModelForCausalLM

        from credo.rollout.vllm_engine import VLLMRolloutEngine

        torch.set_num_threads(max(threads, 1))
        model = AutoModelForCausalLM.from_config(model_config, dtype=dtype)
        self.engine = VLLMRolloutEngine.from_model(model, tokenizer, seed=seed, options=options, scratch=scratch)
        self._arm(crash_on_call)

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        self.engine.update_weights(state, version=version)
        return version

    def weights_fingerprint(self) -> Any:
        return None  # vLLM's weights live in its own processes: the guard probes score_ids instead

    def score_ids(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        return self.engine.score_ids(sequences, starts)

    def close(self) -> None:
        self.engine.close()


class RewardWorker(_Crashable):
    """One reward runner in its own process."""

    def __init__(self, runner_kwargs: dict[str, Any], *, crash_on_call: int | None = None) -> None:
        from credo.rewards import RewardRunner

        torch.set_num_threads(1)
        self.runner = RewardRunner(**runner_kwargs)
        self._arm(crash_on_call)

    def score(self, responses: list[str], examples: list[Example]) -> list[RewardResult]:
        self._count_call()
        return self.runner.score(responses, examples)

    def close(self) -> None:
        self.runner.close()


# ============================================================================ a set of replaceable actors

@dataclass(frozen=True)
class Share:
    """One worker's contiguous share of a call: items [start, stop)."""

    start: int
    stop: int


def split(n_items: int, n_workers: int) -> list[Share]:
    """Contiguous, near-equal shares of ``n_items`` (empty shares dropped)."""
    base, extra = divmod(n_items, n_workers)
    shares, start = [], 0
    for i in range(n_workers):
        stop = start + base + (1 if i < extra else 0)
        if stop > start:
            shares.append(Share(start, stop))
        start = stop
    return shares


def scheduling(placement: str) -> dict[str, Any]:
    """``ray.remote`` options for ``distributed.ray_placement``: ``default`` leaves Ray's default scheduling,
    ``spread`` asks for Ray's SPREAD strategy (the actors of one kind go to different nodes while they fit)."""
    if placement == "default":
        return {}
    if placement == "spread":
        return {"scheduling_strategy": "SPREAD"}
    raise ValueError(f"distributed.ray_placement must be default or spread, got {placement!r}")


class WorkerSet:
    """N actors of one class; :meth:`run` maps shares of a call over them and replaces any that die."""

    def __init__(self, kind: str, cls: type, n: int, make_args: Callable[[], tuple[tuple, dict]], *,
                 num_cpus: float, num_gpus: float = 0.0, faults: dict[int, int] | None = None,
                 on_replace: Callable[[Any], None] | None = None, placement: str = "default") -> None:
        ray = _ray()
        if n < 1:
            raise ValueError(f"{kind} workers must be >= 1, got {n}")
        self.kind = kind
        self._remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0,
                                  **scheduling(placement))(cls)
        self._make_args = make_args
        self._on_replace = on_replace
        self.restarts = 0
        self.actors = [self._spawn((faults or {}).get(i)) for i in range(n)]

    def _spawn(self, crash_on_call: int | None = None):
        args, kwargs = self._make_args()
        return self._remote.remote(*args, crash_on_call=crash_on_call, **kwargs)

    def broadcast(self, method: str, *args) -> list[Any]:
        """Call ``method`` on every actor and wait (a dead actor is replaced and called again)."""
        return self.run(len(self.actors), lambda actor, share: getattr(actor, method).remote(*args),
                        shares=[Share(i, i + 1) for i in range(len(self.actors))])

    def run(self, n_items: int, submit: Callable[[Any, Share], Any], *, shares: list[Share] | None = None) -> list[Any]:
        """``submit(actor, share)`` for each share (share i on actor i); returns the shares' results in order.
        A share whose actor died is re-queued on that actor's replacement."""
        ray = _ray()
        shares = split(n_items, len(self.actors)) if shares is None else shares
        results: list[Any] = [None] * len(shares)
        pending = {submit(self.actors[i], s): i for i, s in enumerate(shares)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            try:
                results[i] = ray.get(done[0])
            except ray.exceptions.RayActorError as exc:
                self._replace(i, exc)
                pending[submit(self.actors[i], shares[i])] = i
        return results

    def _replace(self, i: int, exc: BaseException) -> None:
        ray = _ray()
        self.restarts += 1
        log.warning("%s worker %d died (%s); replacing it and re-queueing its share (restart %d)",
                    self.kind, i, type(exc).__name__, self.restarts)
        try:
            ray.kill(self.actors[i], no_restart=True)
        except Exception:  # already gone
            pass
        self.actors[i] = self._spawn()
        if self._on_replace is not None:
            self._on_replace(self.actors[i])

    def close(self) -> None:
        ray = _ray()
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self.actors = []


# ============================================================================ the pools

class _ServedView:
    """One rollout worker as the weight_sync guard sees an engine: ``weights_fingerprint`` (an HF worker), or
    ``score_ids`` with the vLLM ``options`` (a vLLM worker; the probe's tolerance reads its dtype)."""

    def __init__(self, actor: Any, tokenizer: Any, vllm: Any) -> None:
        self.actor, self.tokenizer, self.options = actor, tokenizer, vllm
        if vllm is None:
            self.weights_fingerprint = lambda: _ray().get(actor.weights_fingerprint.remote())
        else:
            self.score_ids = lambda seqs, starts: _ray().get(actor.score_ids.remote(seqs, starts))


class RolloutPool:
    """A :class:`~credo.rollout.RolloutEngine` over ``workers`` Ray rollout actors (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, workers: int, seed: int = 0,
                 max_batch_size: int = 256, lean: bool = True, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 threads: int = 1, faults: dict[int, int] | None = None, vllm: Any = None,
                 placement: str = "default") -> None:
        self.tokenizer = tokenizer
        self.model_config = model.config
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.policy_version = 0
        self.kv_sessions = False  # a session's keys / values would live in whichever worker ran its row
        dtype = next(model.parameters()).dtype
        config = model.config
        self._rm_scratch: weakref.finalize | None = None
        self._vllm = vllm
        if vllm is None:  # credo's engine in each worker
            cls, extra = RolloutWorker, dict(max_batch_size=max_batch_size, lean=lean)
        else:  # a vLLM engine in each worker (rollout.engine=vllm): options = rollout.vllm
            # the workers' model folders go under one folder of the pool's, removed with the pool (a worker that
            # dies cannot remove its own)
            scratch = tempfile.mkdtemp(prefix="credo-vllm-pool-")
            self._rm_scratch = weakref.finalize(self, shutil.rmtree, scratch, ignore_errors=True)
            cls, extra = VLLMRolloutWorker, dict(options=vllm, seed=seed, scratch=scratch)
        make = lambda: ((config, tokenizer), dict(dtype=dtype, threads=threads, **extra))
        self._weights = None  # ObjectRef of the served weights (replacements load it)
        self.workers = WorkerSet("rollout", cls, workers, make, num_cpus=num_cpus, num_gpus=num_gpus,
                                 faults=faults, on_replace=self._prime, placement=placement)
        self._closes = vllm is not None  # vLLM workers stop their engine (and its processes, its folder) first
        self.update_weights(model, version=0)

    @property
    def restarts(self) -> int:
        return self.workers.restarts

    def _prime(self, actor) -> None:
        _ray().get(actor.load_weights.remote(self._weights, self.policy_version))

    def update_weights(self, weights: torch.nn.Module | dict[str, torch.Tensor], *, version: int) -> None:
        """Every worker serves ``weights`` (a module, or a state dict of whole weights) as policy ``version`` once
        this returns."""
        ray = _ray()
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self._weights = ray.put({k: v.detach().cpu() for k, v in state.items()})
        self.policy_version = version
        self.workers.broadcast("load_weights", self._weights, version)

    def weight_sync_views(self) -> list[Any]:
        """One view per rollout worker for the weight_sync guard (credo.guards.weights.check_weight_sync): an HF
        worker gives its weights' fingerprint, a vLLM worker scores the guard's probe."""
        return [_ServedView(actor, self.tokenizer, self._vllm) for actor in self.workers.actors]

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams, on_done=None) -> list[Trajectory]:
        key = draw_key(self._generator_for(sampling))
        shares = split(len(prompts), len(self.workers.actors))  # whole groups per worker
        parts = self.workers.run(len(prompts), lambda actor, s: actor.generate.remote(
            prompts[s.start : s.stop], n, sampling, (key, s.start * n)), shares=shares)
        out = [replace(t, group_id=t.group_id + s.start) for s, part in zip(shares, parts) for t in part]
        if on_done is not None:  # no streaming across processes: every output is reported at the end
            for i, t in enumerate(out):
                on_done(i, t)
        return out

    def continue_ids(self, prefixes: list[list[int]], sampling: SamplingParams, *, on_finish=None, **kwargs):
        """:meth:`HFRolloutEngine.continue_ids` over the workers (agent loops)."""
        key = draw_key(self._generator_for(sampling))
        parts = self.workers.run(len(prefixes), lambda actor, s: actor.continue_ids.remote(
            prefixes[s.start : s.stop], sampling, kwargs, (key, s.start)))
        out = [c for part in parts for c in part]
        if on_finish is not None:
            for i, c in enumerate(out):
                on_finish(i, c)
        return out

    def encode(self, text: str) -> list[int]:
        from credo.models.tokenizer import encode_prompt

        return encode_prompt(self.tokenizer, text)

    def _generator_for(self, sampling: SamplingParams) -> torch.Generator:
        if sampling.seed is None:
            return self.generator
        return torch.Generator(device="cpu").manual_seed(sampling.seed)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def close(self) -> None:
        if self._closes and self.workers.actors:
            ray = _ray()
            try:
                ray.get([a.close.remote() for a in self.workers.actors], timeout=120)
            except Exception as exc:  # noqa: BLE001 - a dead worker cannot close; the kill below still ends it
                log.warning("rollout workers did not all close cleanly (%s)", type(exc).__name__)
        self.workers.close()
        if self._rm_scratch is not None:
            self._rm_scratch()


class RewardPool:
    """The :class:`~credo.rewards.RewardRunner` interface over ``workers`` Ray reward actors."""

    def __init__(self, runner_kwargs: dict[str, Any], *, workers: int, num_cpus: float = 1.0,
                 faults: dict[int, int] | None = None, placement: str = "default") -> None:
        from credo.rewards.registry import get_reward_fn

        get_reward_fn(runner_kwargs["name_or_path"])  # an unknown verifier fails here, not in a worker
        self.name = runner_kwargs["name_or_path"]
        self.workers = WorkerSet("reward", RewardWorker, workers, lambda: ((runner_kwargs,), {}),
                                 num_cpus=num_cpus, faults=faults, placement=placement)

    @property
    def restarts(self) -> int:
        return self.workers.restarts

    def score(self, responses: Sequence[str], examples: Sequence[Example]) -> list[RewardResult]:
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
        responses, examples = list(responses), list(examples)
        parts = self.workers.run(len(responses), lambda actor, s: actor.score.remote(
            responses[s.start : s.stop], examples[s.start : s.stop]))
        return [r for part in parts for r in part]

    def close(self) -> None:
        self.workers.close()

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
