"""Experiment trackers (credo.tracking.trackers): W&B offline, MLflow's local store and trackio's local store
receive the metrics and the config, resume continues the same tracker runs, a missing package is a clear error,
a failing tracker does not stop the run, a run that raises ends them as failed, nothing is sent over a network;
one tiny `credo train` through the CLI with all three."""
from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from credo.config import ConfigError, LogConfig, load_config
from credo.tracking.metrics import MetricsLogger, read_metrics
from credo.tracking.trackers import (STATE_FILE, TrackerSet, check_trackers, flatten, mlflow_metric_name,
                                     open_trackers)
from tests.conftest import TINY_RUN

REPO = Path(__file__).resolve().parents[2]
CONFIG = {"train": {"lr": 0.001, "betas": [0.9, 0.99]}, "task": {"name": "reversal"}, "run_name": None}


@pytest.fixture(scope="module")
def trackio_dir(tmp_path_factory) -> Path:
    """trackio reads $TRACKIO_DIR once per process (at import): one store for the whole module."""
    return tmp_path_factory.mktemp("trackio")


@pytest.fixture(autouse=True)
def _offline(monkeypatch, trackio_dir):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")  # what an offline run sets (kept out of os.environ here)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # what check_trackers sets (a fresh process: below)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):  # a developer's shell would send test runs there
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRACKIO_DIR", str(trackio_dir))  # restored after each test (open_trackers sets it)


def _log_cfg(*trackers: str, **sections) -> LogConfig:
    cfg = LogConfig(trackers=list(trackers))
    for key, value in sections.items():
        section, _, field = key.partition("__")
        setattr(getattr(cfg, section), field, value)
    return cfg


def _write_rows(run_dir: Path, log: LogConfig, steps: range, *, resume_step: int | None = None) -> None:
    trackers = open_trackers(log, run_dir, config=CONFIG, resume=resume_step is not None)
    with MetricsLogger(run_dir, tensorboard=False, resume_step=resume_step, trackers=trackers) as logger:
        if resume_step is None:
            logger.log(5, {"sft/loss": 2.5}, file="warm_start.jsonl")  # a file with its own step counter
        for step in steps:
            logger.log(step, {"reward/mean": step / 10, "actor/kl": float("nan") if step == 1 else 0.5})


# ----------------------------------------------------------------------------------------- W&B reading


def _wandb_records(path: Path) -> list:
    """The records of a ``run-ID.wandb`` file (W&B's LevelDB-style log: 7-byte header, 32 KiB blocks of chunks
    with a 7-byte header: crc32c, length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, pending, out = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] in (b":W&B", data[:0]), data[:7]  # (empty while wandb starts writing it)
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def _wandb_run(run_dir: Path, index: int = -1) -> dict:
    """History rows, config and run id of the ``index``-th offline run under ``run_dir/wandb``, once its exit record
    is written (wandb's core process may write the file a moment after ``finish()`` returned; 60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        run = _wandb_parse(_wandb_records(files[index]))
        if run["finished"] or time.monotonic() > deadline:
            return run
        time.sleep(0.1)


def _wandb_parse(records: list) -> dict:
    history, config, run_id, finished, exit_code = [], {}, None, False, None
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in r.history.item})
        elif kind in ("run", "config"):
            updates = r.run.config.update if kind == "run" else r.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates})
            run_id = r.run.run_id if kind == "run" else run_id
        elif kind == "exit":
            finished, exit_code = True, r.exit.exit_code
    return {"history": history, "config": config, "id": run_id, "finished": finished, "exit_code": exit_code}


# -------------------------------------------------------------------------------------------- trackers


def test_wandb_offline_run_gets_every_row_and_the_config(tmp_path):
    run_dir = tmp_path / "run-a"
    _write_rows(run_dir, _log_cfg("wandb", wandb__project="proj"), range(3))
    run = _wandb_run(run_dir)
    assert run["finished"] and run["exit_code"] == 0
    assert run["config"]["train"] == {"lr": 0.001, "betas": [0.9, 0.99]}
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run["history"]]
    assert rows[0] == {"warm_start/step": 5, "warm_start/sft/loss": 2.5}
    assert [r["step"] for r in rows[1:]] == [0, 1, 2]
    assert [r["reward/mean"] for r in rows[1:]] == [0.0, 0.1, 0.2]
    assert math.isnan(rows[2]["actor/kl"])  # non-finite values go to W&B as they are
    state = json.loads((run_dir / STATE_FILE).read_text())
    assert state["wandb"] == {"id": run["id"]}  # what a resume reads, nothing more


def test_mlflow_local_store_gets_metrics_by_step_params_and_config(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    calls, log_batch = [], MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        calls.append((bool(metrics), synchronous))
        return log_batch(self, run_id, metrics, params, tags, synchronous=synchronous)

    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    run_dir = tmp_path / "run-b"
    _write_rows(run_dir, _log_cfg("mlflow"), range(3))
    assert [sync for has_metrics, sync in calls if has_metrics] == [False] * 4  # rows logged in the background
    state = json.loads((run_dir / STATE_FILE).read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=state["tracking_uri"])
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run-b"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean")] == \
        [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "actor/kl")) == [0, 2]  # NaN skipped
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "warm_start/sft/loss")] == [(5, 2.5)]
    assert run.data.params["train.lr"] == "0.001" and run.data.params["task.name"] == "reversal"
    assert run.data.params["train.betas"] == "[0.9, 0.99]" and run.data.params["run_name"] == "null"
    artifacts = Path(client.download_artifacts(run.info.run_id, "config.json", str(tmp_path)))
    assert json.loads(artifacts.read_text()) == CONFIG
    assert (run_dir / "mlartifacts").is_dir()  # the local store keeps its artifacts in the run directory


def test_trackio_local_store_gets_metrics_and_config(tmp_path, trackio_dir, monkeypatch):
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    init, kwargs = trackio.init, {}
    monkeypatch.setattr(trackio, "init", lambda **kw: kwargs.update(kw) or init(**kw))
    run_dir = tmp_path / "run-c"
    _write_rows(run_dir, _log_cfg("trackio", trackio__project="p-local", trackio__dir=str(trackio_dir)), range(3))
    assert kwargs["auto_log_gpu"] is False and kwargs["auto_log_cpu"] is False  # no system-metric threads
    assert (trackio_dir / "p-local.db").is_file()
    logs = SQLiteStorage.get_logs("p-local", "run-c")
    assert [(row["step"], row.get("reward/mean")) for row in logs] == [(5, None), (0, 0.0), (1, 0.1), (2, 0.2)]
    assert logs[0]["warm_start/sft/loss"] == 2.5 and math.isnan(logs[2]["actor/kl"])
    config = SQLiteStorage.get_run_config("p-local", "run-c")
    assert config["train"] == CONFIG["train"]


def test_resume_continues_the_same_tracker_runs(tmp_path, trackio_dir):
    from mlflow.tracking import MlflowClient
    from trackio.sqlite_storage import SQLiteStorage

    run_dir = tmp_path / "run-r"
    log = _log_cfg("wandb", "mlflow", "trackio", trackio__project="p-resume", trackio__dir=str(trackio_dir))
    _write_rows(run_dir, log, range(4))
    first = json.loads((run_dir / STATE_FILE).read_text())
    _write_rows(run_dir, log, range(2, 5), resume_step=1)  # the killed run had logged steps 2, 3 already
    again = json.loads((run_dir / STATE_FILE).read_text())
    assert again == first
    assert {name: sorted(entry) for name, entry in first.items()} == \
        {"wandb": ["id"], "mlflow": ["run_id", "tracking_uri"], "trackio": ["name"]}  # what a resume reads
    assert _wandb_run(run_dir, 0)["id"] == _wandb_run(run_dir, 1)["id"] == first["wandb"]["id"]
    assert [r["step"] for r in _wandb_run(run_dir, 1)["history"]] == [2, 3, 4]
    client = MlflowClient(tracking_uri=first["mlflow"]["tracking_uri"])
    assert len(client.search_runs([client.get_experiment_by_name("credo").experiment_id])) == 1
    history = client.get_metric_history(first["mlflow"]["run_id"], "reward/mean")
    assert sorted(m.step for m in history) == [0, 1, 2, 2, 3, 3, 4]  # both runs' rows for the replayed steps
    assert client.get_run(first["mlflow"]["run_id"]).info.status == "FINISHED"
    assert SQLiteStorage.get_runs("p-resume") == ["run-r"]
    assert [row["step"] for row in SQLiteStorage.get_logs("p-resume", "run-r")][-3:] == [2, 3, 4]
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------ errors, failures


@pytest.mark.parametrize("name", ["wandb", "mlflow", "trackio"])
def test_missing_package_is_a_clear_error(monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    with pytest.raises(ConfigError) as err:
        check_trackers(_log_cfg(name))
    assert str(err.value) == f"log.trackers includes {name} but {name} is not installed: pip install 'credo[{name}]'"


def test_missing_package_stops_the_cli_before_the_run_directory(tmp_path, monkeypatch, capsys):
    from credo.cli.main import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["train", "--run-dir", str(tmp_path / "run"), "log.trackers=[wandb]"]) == 2
    assert "pip install 'credo[wandb]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("trackers, message", [
    ("[wandb, neptune]", "log.trackers: unknown tracker 'neptune'; trackers: wandb, mlflow, trackio"),
    ("[mlfow]", "log.trackers: unknown tracker 'mlfow' (did you mean 'mlflow'?); trackers: wandb, mlflow, trackio"),
    ("[1]", "log.trackers: unknown tracker 1; trackers: wandb, mlflow, trackio"),
    ("[mlflow, mlflow]", "log.trackers: mlflow is listed twice"),
    ("wandb", "log.trackers: expected list")])
def test_bad_tracker_lists_are_refused_by_the_config_loader(trackers, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"log.trackers={trackers}"])
    assert str(err.value).startswith(message), str(err.value)


def test_bad_tracker_lists_stop_the_rm_command_too(tmp_path, capsys):
    from credo.cli.main import main

    assert main(["rm", "train", "--run-dir", str(tmp_path / "rm"), "log.trackers=[neptune]"]) == 2
    assert "unknown tracker 'neptune'" in capsys.readouterr().err and not (tmp_path / "rm").exists()


def test_open_trackers_leaves_the_package_check_to_the_preflight(tmp_path, monkeypatch):
    import credo.tracking.trackers as trackers_mod

    def again(log):
        raise AssertionError("check_trackers ran a second time")

    monkeypatch.setattr(trackers_mod, "check_trackers", again)
    opened = open_trackers(_log_cfg("mlflow"), tmp_path, config=CONFIG)
    assert [t.name for t in opened.trackers] == ["mlflow"]
    opened.close()
    with pytest.raises(ConfigError, match="unknown tracker 'neptune'"):  # a LogConfig that skipped the loader
        open_trackers(LogConfig(trackers=["neptune"]), tmp_path, config=CONFIG)


class _Recorder:
    def __init__(self, name: str, fail_at: int | None = None):
        self.name, self.fail_at, self.rows, self.closed, self.failed = name, fail_at, [], False, None

    def log(self, metrics, step, axis):
        if step == self.fail_at:
            raise OSError("disk full")
        self.rows.append((axis, step, dict(metrics)))

    def close(self, failed=False):
        self.closed, self.failed = True, failed


def test_a_failing_tracker_warns_once_and_the_others_go_on(tmp_path):
    bad, good = _Recorder("bad", fail_at=1), _Recorder("good")
    with pytest.warns(RuntimeWarning, match="bad tracker failed in log") as caught:
        with MetricsLogger(tmp_path, tensorboard=False, trackers=TrackerSet([bad, good])) as logger:
            for step in range(4):
                logger.log(step, {"x": step})
    assert len([w for w in caught if "tracker" in str(w.message)]) == 1
    assert [step for _, step, _ in bad.rows] == [0] and bad.closed  # switched off after its failure, closed
    assert [step for _, step, _ in good.rows] == [0, 1, 2, 3] and good.closed
    assert good.failed is False and bad.failed is False  # the run itself went on to its end
    assert [r["x"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]


def test_a_run_that_raises_ends_its_tracker_runs_as_failed(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir, recorder = tmp_path / "run-f", _Recorder("recorder")
    trackers = open_trackers(_log_cfg("wandb", "mlflow"), run_dir, config=CONFIG)
    trackers.trackers.append(recorder)
    with pytest.raises(RuntimeError, match="diverged"):
        with MetricsLogger(run_dir, tensorboard=False, trackers=trackers) as logger:
            logger.log(0, {"x": 1.0})
            raise RuntimeError("diverged")
    assert recorder.closed and recorder.failed is True
    state = json.loads((run_dir / STATE_FILE).read_text())
    client = MlflowClient(tracking_uri=state["mlflow"]["tracking_uri"])
    assert client.get_run(state["mlflow"]["run_id"]).info.status == "FAILED"
    assert [m.value for m in client.get_metric_history(state["mlflow"]["run_id"], "x")] == [1.0]
    run = _wandb_run(run_dir)
    assert run["finished"] and run["exit_code"] == 1


def test_a_tracker_that_cannot_start_is_left_out(tmp_path, monkeypatch):
    import credo.tracking.trackers as trackers_mod

    def refuse(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setitem(trackers_mod._ADAPTERS, "wandb", refuse)
    with pytest.warns(RuntimeWarning, match="wandb tracker could not start"):
        opened = open_trackers(_log_cfg("wandb", "mlflow"), tmp_path, config=CONFIG)
    assert [t.name for t in opened.trackers] == ["mlflow"]
    opened.close()


def test_flatten_dots_nested_keys():
    assert flatten({"a": {"b": 1, "c": {"d": [1]}}, "e": {}, "f": None}) == {"a.b": 1, "a.c.d": [1], "e": {},
                                                                               "f": None}


def test_mlflow_metric_names_replace_what_mlflow_refuses():
    assert mlflow_metric_name("eval/pass@4") == "eval/pass_4"
    assert mlflow_metric_name("timing_s/gen (s)") == "timing_s/gen _s_" and mlflow_metric_name("a-b.c:d") == "a-b.c:d"


# ------------------------------------------------------------------------------------------------ network

_NO_NETWORK = r"""
import json, socket, sys
from pathlib import Path

looked_up, real = [], socket.getaddrinfo


def guard(host, *args, **kwargs):  # every name lookup of this process, refused unless it is this machine
    if host not in ("localhost", "127.0.0.1", "::1"):
        looked_up.append(host)
        raise OSError(f"test: no network for {host}")
    return real(host, *args, **kwargs)


socket.getaddrinfo = guard
from credo.config import LogConfig
from credo.tracking.trackers import check_trackers, open_trackers

log = LogConfig(trackers=["wandb", "mlflow", "trackio"])
check_trackers(log)  # the preflight imports the packages first
trackers = open_trackers(log, Path(sys.argv[1]), config={"a": 1})
names = [t.name for t in trackers.trackers]
for step in range(3):
    trackers.log({"x": float(step)}, step)
trackers.close()
import os
import mlflow.telemetry
from wandb.env import error_reporting_enabled
print(json.dumps({"opened": names, "looked_up": looked_up, "mlflow_telemetry": mlflow.telemetry.get_telemetry_client()
                  is not None, "wandb_error_reports": error_reporting_enabled()}))
"""
# the variables that make MLflow skip its telemetry (a test or CI run) or set the switches themselves
_TELEMETRY_VARS = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "CIRCLECI", "GITLAB_CI", "JENKINS_URL", "TRAVIS",
                   "TF_BUILD", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE", "TEAMCITY_VERSION",
                   "CLOUD_RUN_EXECUTION", "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME", "RUNBOT_WORKER_ID", "DO_NOT_TRACK",
                   "MLFLOW_DISABLE_TELEMETRY", "WANDB_ERROR_REPORTING", "WANDB_API_KEY", "WANDB_MODE")


def test_the_default_trackers_send_nothing_over_a_network(tmp_path, trackio_dir):
    """In a process that does not look like a test or CI run (MLflow sends telemetry only there), with no W&B key:
    MLflow's telemetry and wandb-core's error reports are off, and no host name is looked up."""
    env = {k: v for k, v in os.environ.items() if k not in _TELEMETRY_VARS}
    env |= {"PYTHONPATH": str(REPO), "WANDB_SILENT": "true", "NETRC": str(tmp_path / "no-netrc"),
            "TRACKIO_DIR": str(trackio_dir)}
    proc = subprocess.run([sys.executable, "-c", _NO_NETWORK, str(tmp_path / "run")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"opened": ["wandb", "mlflow", "trackio"], "looked_up": [], "mlflow_telemetry": False,
                      "wandb_error_reports": False}
    assert (tmp_path / "run" / "wandb").is_dir() and list((tmp_path / "run" / "wandb").glob("offline-run-*"))


# --------------------------------------------------------------------------------------------- the CLI


def test_cli_run_sends_metrics_jsonl_to_every_tracker(tmp_path, trackio_dir):
    from mlflow.tracking import MlflowClient
    from trackio.sqlite_storage import SQLiteStorage

    run_dir = tmp_path / "cli-run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "credo.cli.main", "-q", "train", "--run-dir", str(run_dir), *TINY_RUN,
         "train.steps=2", "warm_start.steps=2", "eval.every=2", "log.tensorboard=false", "log.report=false",
         "log.trackers=[wandb, mlflow, trackio]", "log.trackio.project=p-cli", "log.wandb.mode=offline"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and "eval/greedy_acc" in rows[0]
    files = sorted(p.name for p in run_dir.glob("*.jsonl"))
    assert files == ["checkpoints.jsonl", "metrics.jsonl", "warm_start.jsonl"]
    expected = {}  # (TensorBoard tag, step) -> value of every row of every file
    for name in files:
        prefix = "" if name == "metrics.jsonl" else name.removesuffix(".jsonl") + "/"
        expected |= {(prefix + key, row["step"]): value for row in read_metrics(run_dir / name)
                     for key, value in row.items() if key != "step"}
    state = json.loads((run_dir / STATE_FILE).read_text())

    wandb_run = _wandb_run(run_dir)
    got = {}
    for row in wandb_run["history"]:
        axis = "step" if "step" in row else next(key for key in row if key.endswith("/step"))  # its file's step
        got |= {(key, row[axis]): value for key, value in row.items() if key != axis and not key.startswith("_")}
    _assert_same(got, expected)
    assert wandb_run["config"]["train"]["steps"] == 2 and wandb_run["finished"]

    client = MlflowClient(tracking_uri=state["mlflow"]["tracking_uri"])
    run_id = state["mlflow"]["run_id"]
    logged = {(key, m.step): m.value for key in {k for k, _ in expected}
              for m in client.get_metric_history(run_id, mlflow_metric_name(key))}
    _assert_same(logged, {k: v for k, v in expected.items() if v is not None})  # MLflow skips non-finite values
    assert client.get_run(run_id).info.status == "FINISHED" and ("eval/pass@2", 0) in expected
    assert client.get_run(run_id).data.params["train.steps"] == "2"

    tk = {(key, row["step"]): value for row in SQLiteStorage.get_logs("p-cli", "cli-run") for key, value in
          row.items() if key not in ("step", "timestamp")}
    _assert_same(tk, expected)


def _assert_same(got: dict, expected: dict) -> None:
    """Same (key, step) pairs and values; ``None`` in JSONL (a non-finite value) matches NaN / inf."""
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert (not math.isfinite(got[key])) if value is None else got[key] == pytest.approx(value), key


def test_trackers_key_is_loaded_from_overrides():
    cfg = load_config(None, ["log.trackers=[wandb, trackio]", "log.wandb.mode=online", "log.mlflow.experiment=x"])
    assert cfg.log.trackers == ["wandb", "trackio"] and cfg.log.wandb.mode == "online"
    assert cfg.log.mlflow.experiment == "x" and cfg.log.trackio.project == "credo"
