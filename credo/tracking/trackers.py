"""Experiment trackers: Weights & Biases, MLflow and trackio receive what :class:`MetricsLogger` writes.

``log.trackers=[wandb, mlflow, trackio]`` (any subset) opens one tracker run per credo run; every
``MetricsLogger.log(step, metrics, file=...)`` row goes to each of them with the same keys as TensorBoard
(``metrics.jsonl`` keys unchanged, other files prefixed by their stem: ``warm_start/sft/loss``), and the
resolved config (:func:`credo.config.config_to_dict`) is given to each when its run starts.  See docs/tracking.md.

Every adapter has the same tiny protocol (:class:`Tracker`): it is built with the config, then
``log(metrics, step, axis)`` and ``close(failed=...)``.  ``axis`` names the step counter of the row's file
(``step`` for metrics.jsonl, ``warm_start/step`` for warm_start.jsonl): the SFT warm start counts its own steps,
so W&B, whose own ``_step`` must only grow, plots each file against its own axis.  ``failed``: the run ended with
an exception (MLflow status FAILED, W&B exit code 1; trackio runs have no status).

Non-finite values (NaN, +-inf): W&B and trackio receive them as they are (both store and show them as
gaps); MLflow skips them (its sqlite store turns inf into 1.8e308).  MLflow also refuses some characters in
metric names: each is replaced by ``_`` there (:func:`mlflow_metric_name`: ``eval/pass@4`` -> ``eval/pass_4``).
MLflow's rows are logged in its background thread (``synchronous=False``), waited for every
``MLFLOW_WAIT_EVERY`` rows and at ``close()``.

Network: nothing leaves the machine with the defaults.  Before MLflow is first imported ``MLFLOW_DISABLE_TELEMETRY``
is set to ``true`` (MLflow 3 would otherwise fetch its telemetry config from config.mlflow-telemetry.io and post
usage events), and an offline W&B run sets ``WANDB_ERROR_REPORTING=false`` (wandb-core would otherwise resolve
its error-reporting host); a value the user set is kept.

Failures: an unknown or repeated name is a :class:`ConfigError` of the config loader (:func:`validate_trackers`,
which the loader calls); a missing package one of the preflight (:func:`check_trackers`).
A tracker that fails while the run goes on (network, disk, server) warns once, is switched off for the rest of
the run, and the run continues with JSONL / TensorBoard.

Resume: the tracker run ids are kept in ``RUN_DIR/trackers.json``; a resumed run (``resume=True``)
continues the same W&B run (same id, ``resume="allow"``), the same MLflow run (same run id and tracking URI)
and the same trackio run (same name, ``resume="allow"``).  A tracker added on resume starts a new run.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import io
import json
import logging
import math
import netrc
import os
import re
import sys
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from credo.errors import ConfigError
from credo.tracking.atomic import atomic_write_text

__all__ = ["TRACKERS", "STATE_FILE", "Tracker", "TrackerSet", "check_trackers", "open_trackers", "flatten",
           "mlflow_metric_name"]

TRACKERS = ("wandb", "mlflow", "trackio")  # the names log.trackers takes
STATE_FILE = "trackers.json"  # tracker run ids, read on resume
MLFLOW_PARAM_MAX = 6000  # MLflow's limit on one param value (characters)
MLFLOW_WAIT_EVERY = 100  # MLflow rows logged in the background between two waits for them
_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")  # MLflow refuses other characters in metric names
# tracker -> the modules it needs (the first is the tracker's own package); all come with credo[<tracker>]
_MODULES = {"wandb": ("wandb",), "mlflow": ("mlflow", "sqlalchemy", "alembic"), "trackio": ("trackio",)}

_log = logging.getLogger(__name__)


class Tracker(Protocol):
    """What :class:`MetricsLogger` calls on each tracker (built with the run's config)."""

    name: str

    def log(self, metrics: Mapping[str, int | float], step: int, axis: str) -> None: ...

    def close(self, failed: bool = False) -> None: ...


# ------------------------------------------------------------------------------------------ checks


def validate_trackers(log: Any) -> None:
    """``log.trackers`` names known trackers (:data:`TRACKERS`), each once; whether their packages are installed is
    the preflight's check (:func:`check_trackers`)."""
    for name in log.trackers:
        if name not in TRACKERS:
            close = difflib.get_close_matches(str(name), TRACKERS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"log.trackers: unknown tracker {name!r}{hint}; trackers: {', '.join(TRACKERS)}")
        if log.trackers.count(name) > 1:
            raise ConfigError(f"log.trackers: {name} is listed twice")


def check_trackers(log: Any) -> None:
    """The packages of every tracker in ``log.trackers`` (a validated :class:`credo.config.schema.LogConfig`)
    import; else a one-line :class:`ConfigError` naming the pip extra (the preflight's check)."""
    for name in log.trackers:
        modules = _MODULES[name]
        if name == "mlflow":
            _no_mlflow_telemetry()
            uri, _ = _mlflow_uri(log.mlflow, Path("."))
            if not uri.startswith("sqlite:"):
                modules = modules[:1]  # a tracking server does not need MLflow's SQL backend here
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError:
                raise ConfigError(_missing(name, module)) from None


def _missing(name: str, module: str) -> str:
    return f"log.trackers includes {name} but {module} is not installed: pip install 'credo[{name}]'"


def _no_mlflow_telemetry() -> None:
    """MLflow 3 sends usage telemetry by default (its config from config.mlflow-telemetry.io, then events);
    it reads the switch when it is imported: call this first (the user's own setting is kept)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


# ----------------------------------------------------------------------------------------- helpers


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys: ``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@functools.lru_cache(maxsize=4096)
def mlflow_metric_name(key: str) -> str:
    """``key`` with each character MLflow refuses in a metric name replaced by ``_`` (``eval/pass@4`` ->
    ``eval/pass_4``); cached, as a run logs the same few keys at every step."""
    return _MLFLOW_BAD_CHARS.sub("_", key)


def _read_state(run_dir: Path) -> dict[str, Any]:
    """``RUN_DIR/trackers.json`` ({} when missing or unreadable)."""
    try:
        state = json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(run_dir: Path, name: str, entry: dict[str, Any]) -> None:
    """Store what a resume of tracker ``name`` reads in ``RUN_DIR/trackers.json`` (atomic replace)."""
    state = _read_state(run_dir)
    state[name] = entry
    atomic_write_text(run_dir / STATE_FILE, json.dumps(state, indent=1) + "\n")


def _wandb_key_found() -> bool:
    """Whether W&B has an API key here: ``$WANDB_API_KEY`` or a netrc entry for its host (``wandb login``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _mlflow_uri(cfg: Any, run_dir: Path) -> tuple[str, bool]:
    """(``log.mlflow.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///RUN_DIR/mlflow.db``; whether
    it is that last one, credo's local store)."""
    uri = cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri, False
    return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}", True


@contextlib.contextmanager
def _quiet(name: str):
    """Send what a tracker prints on stdout (trackio's banners) to credo's log instead of the terminal."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        for line in buffer.getvalue().splitlines():
            if line.strip():
                _log.info("%s: %s", name, line.strip())


# ---------------------------------------------------------------------------------------- adapters


class WandbTracker:
    """A W&B run (offline without an API key); each file's rows are plotted against their own step axis."""

    name = "wandb"

    def __init__(self, cfg: Any, run_dir: Path, *, resume: bool, config: Mapping[str, Any]):
        mode = cfg.mode
        if mode == "auto":
            mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_key_found() else "offline")
        if mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # wandb-core's reports need a network
        import wandb

        base = Path(cfg.dir) if cfg.dir else run_dir
        base.mkdir(parents=True, exist_ok=True)
        previous = _read_state(run_dir).get(self.name, {}) if resume else {}
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, name=cfg.name or run_dir.resolve().name, dir=str(base),
            group=cfg.group, tags=list(cfg.tags) or None, mode=mode, id=previous.get("id"),
            resume="allow" if previous.get("id") else None, reinit="create_new", config=dict(config),
            settings=wandb.Settings(silent=True, console="off"))
        self._defined: set[str] = set()  # step axes and metric keys already told to W&B (define_metric)
        _write_state(run_dir, self.name, {"id": self.run.id})
        if mode == "offline":
            _log.info("W&B offline run %s under %s (upload: wandb sync %s)", self.run.id, base / "wandb",
                      Path(self.run.dir).parent)

    def log(self, metrics: Mapping[str, int | float], step: int, axis: str) -> None:
        """One row, with ``axis: step`` added; W&B's own ``_step`` counts the rows."""
        for key in metrics:
            if key not in self._defined:
                if axis not in self._defined:
                    self.run.define_metric(axis, hidden=False)
                    self._defined.add(axis)
                self.run.define_metric(key, step_metric=axis)
                self._defined.add(key)
        self.run.log({axis: step, **metrics})

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run (``MlflowClient``, no global state); config as flat params plus ``config.json``."""

    name = "mlflow"

    def __init__(self, cfg: Any, run_dir: Path, *, resume: bool, config: Mapping[str, Any]):
        _no_mlflow_telemetry()
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        self._pending: list[Any] = []  # RunOperations of rows logged in MLflow's background thread
        uri, local = _mlflow_uri(cfg, run_dir)
        self.client = MlflowClient(tracking_uri=uri)
        previous = _read_state(run_dir).get(self.name, {}) if resume else {}
        if previous.get("run_id") and previous.get("tracking_uri") == uri:
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self._new_run(cfg, run_dir, local)
        _write_state(run_dir, self.name, {"run_id": self.run_id, "tracking_uri": uri})
        _log.info("MLflow run %s at %s", self.run_id, uri)
        self._log_config(config)

    def _new_run(self, cfg: Any, run_dir: Path, local: bool) -> str:
        """Create the experiment if missing (credo's local store keeps its artifacts in RUN_DIR/mlartifacts)."""
        experiment = self.client.get_experiment_by_name(cfg.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            location = (run_dir / "mlartifacts").resolve().as_uri() if local else None
            experiment_id = self.client.create_experiment(cfg.experiment, artifact_location=location)
        run = self.client.create_run(experiment_id, run_name=cfg.run_name or run_dir.resolve().name,
                                     tags={"credo.run_dir": str(run_dir.resolve())})
        return run.info.run_id

    def _log_config(self, config: Mapping[str, Any]) -> None:
        """Flat params (``train.lr``; a value already logged by the run before a resume is kept) and the whole
        nested config as the artifact ``config.json``."""
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        values = {key: (value if isinstance(value, str) else json.dumps(value))[:MLFLOW_PARAM_MAX]
                  for key, value in flatten(config).items()}
        changed = [key for key, value in values.items() if key in logged and logged[key] != value]
        if changed:  # MLflow refuses to change a logged param
            _log.info("MLflow keeps the first run's values of params changed on resume: %s", ", ".join(changed))
        params = [Param(key, value) for key, value in values.items() if key not in logged]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.client.log_dict(self.run_id, dict(config), "config.json")

    def log(self, metrics: Mapping[str, int | float], step: int, axis: str) -> None:
        """Finite values only, in MLflow's background thread (waited for every ``MLFLOW_WAIT_EVERY`` rows)."""
        now = int(time.time() * 1000)
        batch = [self._metric(mlflow_metric_name(key), float(value), now, step)
                 for key, value in metrics.items() if math.isfinite(value)]
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
            self._pending.append(self.client.log_batch(self.run_id, metrics=batch[start:start + 1000],
                                                       synchronous=False))
        if len(self._pending) >= MLFLOW_WAIT_EVERY:
            self._wait()

    def _wait(self) -> None:
        """Block until the rows logged in the background are stored (raises if one of them failed)."""
        pending, self._pending = self._pending, []
        for operation in pending:
            operation.wait()

    def close(self, failed: bool = False) -> None:
        try:
            self._wait()
        finally:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class TrackioTracker:
    """A trackio run in its local store (a project's runs share one dashboard: ``trackio show``)."""

    name = "trackio"

    def __init__(self, cfg: Any, run_dir: Path, *, resume: bool, config: Mapping[str, Any]):
        _set_trackio_dir(cfg.dir)
        import trackio

        previous = _read_state(run_dir).get(self.name, {}) if resume else {}
        name = previous.get("name") or cfg.name or run_dir.resolve().name
        with _quiet(self.name):
            self.run = trackio.init(project=cfg.project, name=name, config=dict(config),
                                    resume="allow" if previous else "never", embed=False, auto_log_cpu=False,
                                    auto_log_gpu=False)
        _write_state(run_dir, self.name, {"name": name})

    def log(self, metrics: Mapping[str, int | float], step: int, axis: str) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self, failed: bool = False) -> None:
        """Finish the run (trackio has no failed status), and unset it as trackio's current run (else trackio
        finishes it again at exit)."""
        import trackio

        with _quiet(self.name):
            if trackio.context_vars.current_run.get() is self.run:
                trackio.finish()
            else:
                self.run.finish()


_ADAPTERS = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}


def _set_trackio_dir(directory: str | None) -> None:
    """trackio reads ``$TRACKIO_DIR`` once, when it is imported: set it first, and refuse a second directory."""
    if directory is None:
        return
    wanted = Path(directory).expanduser().resolve()
    utils = sys.modules.get("trackio.utils")
    if utils is not None and Path(utils.TRACKIO_DIR).resolve() != wanted:
        raise ConfigError(f"log.trackio.dir: trackio is already imported in this process with its store at "
                          f"{utils.TRACKIO_DIR}; one process has one trackio directory")
    os.environ["TRACKIO_DIR"] = str(wanted)


# ------------------------------------------------------------------------------------------ the set


class TrackerSet:
    """The open trackers of one run; a tracker that raises warns once and gets nothing more but its close()."""

    def __init__(self, trackers: Iterable[Tracker] = ()):
        self.trackers = list(trackers)
        self._failed: list[Tracker] = []  # switched off; close() still tries to finish their runs

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log(self, metrics: Mapping[str, int | float], step: int, axis: str = "step") -> None:
        if not metrics:
            return
        for tracker in list(self.trackers):
            try:
                tracker.log(metrics, step, axis)
            except Exception as exc:  # a tracker must never stop the training run
                self.trackers.remove(tracker)
                self._failed.append(tracker)
                warnings.warn(f"{tracker.name} tracker failed in log() and is off for the rest of the run "
                              f"({type(exc).__name__}: {exc}); metrics still go to JSONL", RuntimeWarning,
                              stacklevel=2)

    def close(self, *, failed: bool = False) -> None:
        """Finish every tracker run (``failed``: the run ended with an exception); a failing close warns, except
        of a tracker that failed before. The set is empty afterwards."""
        for tracker in self.trackers + self._failed:
            try:
                tracker.close(failed=failed)
            except Exception as exc:
                if tracker in self.trackers:
                    warnings.warn(f"{tracker.name} tracker failed to close ({type(exc).__name__}: {exc})",
                                  RuntimeWarning, stacklevel=2)
                else:
                    _log.debug("%s tracker (off since a failure) did not close: %s", tracker.name, exc)
        self.trackers.clear()
        self._failed.clear()


def open_trackers(log: Any, run_dir: str | Path, *, config: Mapping[str, Any], resume: bool = False) -> TrackerSet:
    """Open the trackers of ``log.trackers`` for the run in ``run_dir``, each given ``config``.

    An unknown name or a missing package raises :class:`ConfigError` (the loader and the preflight have
    checked them before a CLI run); a tracker that fails to start (no network, an unreachable server) warns and
    is left out.
    """
    validate_trackers(log)
    config = json.loads(json.dumps(config, default=str))  # plain JSON values (a Path becomes its string)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    opened: list[Tracker] = []
    for name in log.trackers:
        try:
            opened.append(_ADAPTERS[name](getattr(log, name), run_dir, resume=resume, config=config))
        except (ConfigError, ImportError) as exc:
            TrackerSet(opened).close(failed=True)
            if isinstance(exc, ImportError):
                raise ConfigError(_missing(name, exc.name or name)) from exc
            raise
        except Exception as exc:  # a tracker must never stop the training run
            warnings.warn(f"{name} tracker could not start and is off for this run ({type(exc).__name__}: {exc}); "
                          f"metrics still go to JSONL", RuntimeWarning, stacklevel=2)
    return TrackerSet(opened)
