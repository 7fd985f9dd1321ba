"""credo.train.host_memory: with freed memory kept, a step's large tensors are not faulted in again."""
from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from credo.config import load_config
from credo.train.host_memory import reuse_freed_memory

PROBE = """
import json, resource, sys, torch
if sys.argv[1] == "reuse":
    from credo.train.host_memory import reuse_freed_memory
    assert reuse_freed_memory()
def step():  # a training step's pattern: large tensors (above glibc's 32 MiB mmap ceiling) made, used, freed
    a = torch.empty(64 << 18); a.fill_(1.0)  # 64 MiB, every page touched
    b = torch.empty(40 << 18); b.fill_(2.0)  # 40 MiB
    (a[: 40 << 18] * b).sum()  # a 40 MiB temporary
    del a, b
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_second_step_reuses_the_first_steps_memory():
    # 144 MiB a step = 36,864 pages of 4 KiB: by default every step's tensors are fresh mmaps, each page faulted in
    assert min(_faults("default")[3:]) >= 36_000
    # kept: after a few steps the heap holds blocks that fit, and a step faults (almost) nothing in; the median
    # over steps 4-11, since where glibc places a block can still make one step fault a block in
    kept = sorted(_faults("reuse")[4:])
    assert kept[len(kept) // 2] < 256, kept


def test_it_is_on_by_default_and_reports_what_it_did():
    assert load_config(None, []).train.reuse_host_memory is True
    assert reuse_freed_memory() is (platform.libc_ver()[0] == "glibc")  # elsewhere nothing changes: False


@pytest.mark.parametrize("flag", [True, False])
def test_every_recipes_process_setup_applies_the_flag(monkeypatch, flag):
    import credo.recipes.common as common

    calls = []
    monkeypatch.setattr(common, "reuse_freed_memory", lambda: calls.append(1) or True)
    common.process_setup(load_config(None, [f"train.reuse_host_memory={str(flag).lower()}"]))
    assert calls == ([1] if flag else [])
