"""Issue 33, run directories and checkpoints: ``--overwrite`` acts only on credo's runs and deletes only what credo
wrote (item 1), a full disk during a checkpoint (item 4), preemption by SIGTERM / SIGUSR1 (item 5), hostile run
directories (item 7: links planted for export and resume, plugins imported from the run), the resume message of a
run killed before its first checkpoint (item 10). Each test fails on the code before the issue."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.tracking.metrics import MetricsLogger, read_metrics
from credo.tracking.rundir import MARKER, UnsafeRunDir, check_run_dir, is_credo_entry
from credo.train import checkpoint as ck
from tests.conftest import TINY_RUN

REPO = Path(__file__).resolve().parents[2]
QUIET = ["eval.every=0", "log.report=false", "log.tensorboard=false", "log.progress=false"]
RUN = [*TINY_RUN, *QUIET, "train.steps=2", "checkpoint.every=1"]
VOLATILE = ("timing_s/", "perf/tokens_per_s", "perf/gen_tokens_per_s")


def _rows(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(path)]


def _one_credo_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("credo:")]
    assert len(lines) == 1, lines
    return lines[0]


# ============================================================================ item 1: --overwrite

def test_overwrite_never_deletes_a_project_folder_that_has_a_config_yaml(tmp_path: Path, capsys):
    project = tmp_path / "project"  # a Hydra / Kubernetes / CI project: config.yaml, sources, .git
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("print('hello')\n")
    (project / "config.yaml").write_text("trainer: {epochs: 3}\n")
    before = sorted(p.relative_to(project).as_posix() for p in project.rglob("*"))
    assert main(["-q", "train", "--run-dir", str(project), *RUN, "--overwrite"]) == 1
    line = _one_credo_line(capsys.readouterr().err)
    assert "--overwrite refuses" in line and MARKER in line and "nothing was deleted" in line
    assert sorted(p.relative_to(project).as_posix() for p in project.rglob("*")) == before
    assert (project / "config.yaml").read_text() == "trainer: {epochs: 3}\n"


def test_overwrite_deletes_only_what_credo_wrote(tmp_path: Path, capsys):
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (outside / "data.txt").write_text("not credo's")
    assert main(["-q", "train", "--run-dir", str(run), *RUN]) == 0
    assert (run / MARKER).is_file() and (run / "checkpoints" / "step_000002").is_dir()
    (run / "notes.txt").write_text("mine")  # the user's own files in the run directory
    (run / "analysis").mkdir()
    (run / "analysis" / "plot.py").write_text("# mine")
    (run / "link").symlink_to(outside, target_is_directory=True)  # a link: kept, never followed
    assert main(["-q", "train", "--run-dir", str(run), *RUN, "train.steps=1", "--overwrite"]) == 0
    assert (run / "notes.txt").read_text() == "mine" and (run / "analysis" / "plot.py").is_file()
    assert (run / "link").is_symlink() and (outside / "data.txt").read_text() == "not credo's"
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1]  # the new run's rows only
    assert not (run / "checkpoints" / "step_000002").exists()


def test_every_entry_a_run_writes_is_recognised_as_credos(tmp_path: Path):
    """The list of entries --overwrite deletes covers what runs write (regression net for new outputs)."""
    run = tmp_path / "run"
    args = [*TINY_RUN, "train.steps=2", "checkpoint.every=1", "eval.every=1", "log.rollouts_every=1",
            "log.report=true", "log.tensorboard=true", "log.progress=false"]
    assert main(["-q", "train", "--run-dir", str(run), *args]) == 0
    entries = sorted(run.iterdir())
    assert {e.name for e in entries} >= {MARKER, "config.yaml", "metrics.jsonl", "rollouts.jsonl", "tb", "final",
                                         "checkpoints", "eval_samples", "report.html", "summary.json"}
    assert [e.name for e in entries if not is_credo_entry(e)] == []


# ============================================================================ item 4: a full disk at a checkpoint

def _no_space(real):
    """save_state that writes part of its file, then fails as safetensors does on a full disk (its own error type,
    not an OSError: that is what reached the user as a traceback)."""
    class SafetensorError(Exception):
        pass

    def fails(state, folder):
        if "step_000004" in str(folder) or ".tmp-step_000004" in str(folder):
            (Path(folder) / "trainer_state.safetensors").write_bytes(b"\0" * 4096)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(state, folder)
    return fails


def test_full_disk_at_a_checkpoint_is_one_line_leaves_nothing_and_resume_matches(tmp_path: Path, capsys,
                                                                                monkeypatch):
    args = [*TINY_RUN, *QUIET, "train.steps=6", "checkpoint.every=2", "checkpoint.keep=3"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "full"), *args]) == 0
    run = tmp_path / "cut"
    monkeypatch.setattr(ck, "save_state", _no_space(ck.save_state))
    assert main(["-q", "train", "--run-dir", str(run), *args]) == 1
    line = _one_credo_line(capsys.readouterr().err)
    assert line.startswith("credo: error: checkpoint step_000004: no space left on the device of ")
    assert "needs about" in line and "is free" in line and "step_000002 is untouched" in line
    assert f"credo train --resume {run}" in line
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["latest", "step_000002"]  # no .tmp-step_000004-PID left
    assert ck.checkpoint_problem(run / "checkpoints" / "step_000002") is None
    monkeypatch.undo()  # space again: resume continues from step 2 and gives the uninterrupted run's rows
    assert main(["-q", "train", "--resume", str(run)]) == 0
    assert _rows(run / "metrics.jsonl") == _rows(tmp_path / "full" / "metrics.jsonl")


def test_disk_full_is_recognised_in_its_forms(tmp_path: Path):
    assert ck._disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path, 0)
    assert ck._disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path, 0)
    assert ck._disk_full(RuntimeError("I/O error: No space left on device (os error 28)"), tmp_path, 0)
    assert not ck._disk_full(RuntimeError("a bug"), tmp_path, 0)
    assert ck._disk_full(RuntimeError("unexpected pos 576 vs 534"), tmp_path, 1 << 62)  # less free than needed


def _mounted_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_real_full_tmpfs_at_a_checkpoint(tmp_path: Path):
    """save_checkpoint on a tmpfs of 1 MiB that a filler leaves ~64 KiB free: the real ENOSPC / SafetensorError."""
    import torch

    from credo.models import build_model
    from tests.conftest import TINY

    disk = tmp_path / "disk"
    if not _mounted_tmpfs(disk, "1m"):
        pytest.skip("mounting a tmpfs needs root and mount permission (it is run where CI runs as root)")
    try:
        model, tokenizer = build_model(TINY, seed=0)
        state = {"step": 1, "optimizer": {"m": torch.zeros(1000)}}
        ck.save_checkpoint(disk, 1, model=model, tokenizer=tokenizer, trainer_state=state, keep=3)
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(b"\0" * max(free - (64 << 10), 0))
        with pytest.raises(ck.CheckpointSpaceError, match=r"checkpoint step_000002: no space left .* step_000001 is"):
            ck.save_checkpoint(disk, 2, model=model, tokenizer=tokenizer, trainer_state=state, keep=3)
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["latest", "step_000001"]
        (disk / "filler").unlink()
        assert ck.resume_checkpoint(disk).name == "step_000001"
        ck.save_checkpoint(disk, 2, model=model, tokenizer=tokenizer, trainer_state=state, keep=3)
        assert ck.latest_checkpoint(disk).name == "step_000002"
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_resume_removes_partial_folders_of_earlier_saves(tmp_path: Path):
    run = tmp_path / "run"
    assert main(["-q", "train", "--run-dir", str(run), *RUN]) == 0
    for name in (".tmp-step_000003-4242", ".old-step_000002-4243"):  # a killed save, a killed re-save
        (run / "checkpoints" / name / "model").mkdir(parents=True)
        (run / "checkpoints" / name / "model" / "model.safetensors").write_bytes(b"\0" * 100)
    (run / "checkpoints" / "keep-me").mkdir()  # not credo's name: untouched
    assert main(["-q", "train", "--resume", str(run), "train.steps=3"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir()) == \
        ["keep-me", "step_000002", "step_000003"]  # checkpoint.keep=2


# ============================================================================ item 5: preemption

def _train_process(run: Path, args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "credo.cli.main", "-q", "train", "--run-dir", str(run), *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _signal_after_rows(proc: subprocess.Popen, metrics: Path, rows: int, sig: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= rows:
            proc.send_signal(sig)
            return
        time.sleep(0.02)
    raise AssertionError(f"the run ended or stalled before {rows} rows: {proc.poll()}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_signal_checkpoints_exits_75_and_resume_matches(tmp_path: Path, sig: int):
    args = [*TINY_RUN, *QUIET, "train.steps=30", "checkpoint.every=0"]  # only the final checkpoint is due
    run = tmp_path / "cut"
    proc = _train_process(run, args)
    _signal_after_rows(proc, run / "metrics.jsonl", 3, sig)  # step 0 and two RL steps logged
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    line = _one_credo_line(err.replace(f"credo: {signal.Signals(sig).name} received", "notice"))
    assert line.startswith(f"credo: preempted: {signal.Signals(sig).name} after RL step ")
    step = int(line.split("after RL step ")[1].split(":")[0])
    assert 2 <= step < 30 and ck.latest_checkpoint(run).name == f"step_{step:06d}"
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(step + 1))
    if sig != signal.SIGTERM:
        return  # the resume is the same for either signal
    assert main(["-q", "train", "--resume", str(run)]) == 0
    assert main(["-q", "train", "--run-dir", str(tmp_path / "full"), *args]) == 0
    assert _rows(run / "metrics.jsonl") == _rows(tmp_path / "full" / "metrics.jsonl")


def test_on_signal_false_stops_at_once_as_before(tmp_path: Path):
    run = tmp_path / "run"
    proc = _train_process(run, [*TINY_RUN, *QUIET, "train.steps=200", "checkpoint.every=0",
                                "checkpoint.on_signal=false"])
    _signal_after_rows(proc, run / "metrics.jsonl", 2, signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM and not (run / "checkpoints").exists()


def test_a_second_signal_abandons_the_step():
    from credo.recipes.preemption import Preempted, StopSignals

    before = signal.getsignal(signal.SIGTERM)  # whatever an earlier test (Ray's init) left installed
    with StopSignals(True) as stop:
        assert stop.requested() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested() == "SIGUSR1"
        with pytest.raises(Preempted, match="a second SIGTERM: the step in progress was abandoned"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
    assert signal.getsignal(signal.SIGTERM) is before  # restored
    assert StopSignals(False).requested() is None


class _Ranks:
    """DataParallel's max_over_ranks as another rank that got a signal sees it."""
    enabled = True

    def __init__(self, other: int) -> None:
        self.other = other

    def max_over_ranks(self, n: int) -> int:
        return max(n, self.other)


def test_every_rank_stops_after_the_step_in_which_any_rank_got_a_signal():
    from credo.recipes.preemption import StopSignals

    with StopSignals(True) as stop:  # this rank got nothing, rank 1 got SIGTERM
        assert stop.requested(_Ranks(int(signal.SIGTERM))) == "SIGTERM"
        assert stop.requested(_Ranks(0)) is None


# ============================================================================ item 7: hostile run directories

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("done") / "run"
    assert main(["-q", "train", "--run-dir", str(run), *RUN, "log.rollouts_every=1"]) == 0
    return run


def _copy(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to, symlinks=True)
    return to


def test_export_never_copies_through_a_link_planted_in_final(finished_run: Path, tmp_path: Path, capsys):
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN PRIVATE KEY-----")
    run = _copy(finished_run, tmp_path / "run")
    (run / "final" / "tokenizer.json").unlink()
    (run / "final" / "tokenizer.json").symlink_to(secret)
    assert main(["-q", "export", str(run), "--out", str(tmp_path / "out")]) == 1
    line = _one_credo_line(capsys.readouterr().err)
    assert "is a symlink" in line and "tokenizer.json" in line
    out = tmp_path / "out"  # refused before anything is written; nothing of the secret in any case
    leaked = [p for p in out.rglob("*") if p.is_file() and "PRIVATE KEY" in p.read_text(errors="replace")] \
        if out.exists() else []
    assert leaked == [] and not out.exists()


def test_final_has_a_manifest_and_export_refuses_a_changed_file(finished_run: Path, tmp_path: Path, capsys):
    manifest = json.loads((finished_run / "final" / "MANIFEST.json").read_text())
    assert "config.json" in manifest["files"] and "model.safetensors" in manifest["files"]
    assert main(["-q", "export", str(finished_run), "--out", str(tmp_path / "ok")]) == 0
    assert not (tmp_path / "ok" / "MANIFEST.json").exists() and (tmp_path / "ok" / "config.json").is_file()
    run = _copy(finished_run, tmp_path / "run")
    (run / "final" / "config.json").write_text((run / "final" / "config.json").read_text() + " ")
    assert main(["-q", "export", str(run), "--out", str(tmp_path / "out")]) == 1
    assert "config.json has the wrong size" in _one_credo_line(capsys.readouterr().err)


@pytest.mark.parametrize("planted", ["summary.json", "checkpoints.jsonl", "rollouts.jsonl", "metrics.jsonl",
                                     "config.tmp", "checkpoints/latest.tmp", "eval_samples"])
def test_resume_never_writes_through_a_planted_link(finished_run: Path, tmp_path: Path, capsys, planted: str):
    victim = tmp_path / "victim"
    victim.write_text("the user's file\n")
    run = _copy(finished_run, tmp_path / "run")
    target = run / planted
    if target.is_dir():
        import shutil

        shutil.rmtree(target)
        victim = tmp_path / "victim_dir"
        victim.mkdir()
    else:
        target.unlink(missing_ok=True)
    target.symlink_to(victim)
    assert main(["-q", "train", "--resume", str(run), "train.steps=3"]) == 1
    line = _one_credo_line(capsys.readouterr().err)
    assert line.startswith("credo: error: --resume: ") and "is a symlink" in line and planted.split("/")[-1] in line
    if victim.is_file():
        assert victim.read_text() == "the user's file\n"
    else:
        assert list(victim.iterdir()) == []


def test_a_link_planted_while_running_is_refused_by_the_writers(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rollouts.jsonl").symlink_to(victim)
    logger = MetricsLogger(tmp_path / "run", tensorboard=False)
    with pytest.raises(UnsafeRunDir, match="rollouts.jsonl is a symlink"):
        logger.log_record(1, {"x": 1}, file="rollouts.jsonl")
    (tmp_path / "run" / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(UnsafeRunDir, match="metrics.jsonl is a symlink"):
        logger.log(1, {"x": 1})
    logger.close()
    assert victim.read_text() == "keep\n"
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    (ckpt / "COMPLETE").symlink_to(victim)
    with pytest.raises(UnsafeRunDir):
        ck._write_synced(ckpt / "COMPLETE", "step_000001")
    assert victim.read_text() == "keep\n"


def test_links_inside_a_trackers_folder_that_stay_inside_are_allowed(tmp_path: Path):
    run = tmp_path / "run"
    (run / "wandb" / "run-1").mkdir(parents=True)
    (run / "wandb" / "latest-run").symlink_to(run / "wandb" / "run-1", target_is_directory=True)
    check_run_dir(run, "--resume")
    (run / "wandb" / "escape").symlink_to(tmp_path)
    with pytest.raises(UnsafeRunDir, match="escape is a symlink"):
        check_run_dir(run, "--resume")


def test_resume_never_imports_a_plugin_from_the_run_directory(finished_run: Path, tmp_path: Path, capsys,
                                                            monkeypatch):
    run = _copy(finished_run, tmp_path / "run")
    touched = tmp_path / "code_ran"
    (run / "credo_evil_plugin_33.py").write_text(f"open({str(touched)!r}, 'w').write('ran')\n")
    cfg = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(cfg.replace("plugins: []", "plugins: [credo_evil_plugin_33]"))
    assert "credo_evil_plugin_33" in (run / "config.yaml").read_text()
    monkeypatch.chdir(run)  # cd RUN && credo train --resume .
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["-q", "train", "--resume", ".", "train.steps=3"]) == 2
    line = _one_credo_line(capsys.readouterr().err)
    assert "credo_evil_plugin_33" in line and "would be imported from the run directory" in line
    assert not touched.exists() and "credo_evil_plugin_33" not in sys.modules
    assert main(["-q", "eval", "."]) == 2  # credo eval RUN reads the same config
    assert not touched.exists()


# ============================================================================ item 10: resume before a checkpoint

def test_resume_before_the_first_checkpoint_names_overwrite_and_that_command_works(tmp_path: Path, capsys,
                                                                                  monkeypatch):
    import credo.recipes.rlvr as rlvr

    run = tmp_path / "run"
    real = rlvr.rl_step

    def crashes(cfg, parts, state, *, step):
        raise KeyboardInterrupt

    monkeypatch.setattr(rlvr, "rl_step", crashes)
    assert main(["-q", "train", "--run-dir", str(run), *RUN]) == 130
    monkeypatch.setattr(rlvr, "rl_step", real)
    capsys.readouterr()
    assert main(["-q", "train", "--resume", str(run)]) == 1
    line = _one_credo_line(capsys.readouterr().err)
    command = f"credo train --config {run}/config.yaml --run-dir {run} --overwrite"
    assert line.endswith(command)
    assert main(["-q", *command.split()[1:]]) == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2]


def test_report_never_copies_a_linked_file_into_the_page(finished_run: Path, tmp_path: Path, capsys):
    secret = tmp_path / "secret.yaml"
    secret.write_text("api_key: s3cr3t\n")
    run = _copy(finished_run, tmp_path / "run")
    (run / "report.html").unlink(missing_ok=True)
    (run / "config.yaml").unlink()
    (run / "config.yaml").symlink_to(secret)
    assert main(["-q", "report", str(run)]) == 1
    assert "config.yaml is a symlink" in _one_credo_line(capsys.readouterr().err)
    assert not (run / "report.html").exists()


def test_torchrun_ranks_checkpoint_the_same_step_on_sigterm(tmp_path: Path):
    """SIGTERM to torchrun (which forwards it to its workers and waits for them): both gloo ranks finish the same
    step, write its checkpoint and stop (rank 0 in RUN, rank 1 in RUN/rank1)."""
    import shutil

    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    assert credo and torchrun, "the credo / torchrun console scripts are installed with credo and torch"
    run = tmp_path / "dp"
    proc = subprocess.Popen([torchrun, "--nproc-per-node", "2", "--no-python", credo, "-q", "train", *TINY_RUN,
                             *QUIET, "train.steps=60", "checkpoint.every=0", f"--run-dir={run}",
                             "distributed.backend=torchrun"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _signal_after_rows(proc, run / "metrics.jsonl", 3, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert err.count("credo: preempted: SIGTERM after RL step") == 2, err[-3000:]
    zero, one = ck.latest_checkpoint(run), ck.latest_checkpoint(run / "rank1")
    assert zero is not None and one is not None and zero.name == one.name, err[-3000:]
    assert len(read_metrics(run / "metrics.jsonl")) == int(zero.name.split("_")[1]) + 1
