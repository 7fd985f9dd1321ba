"""credo: reinforcement-learning post-training of language models with verifiable rewards.

The package root stays light (no torch import) so that reward worker processes start quickly.

Importing it sets ``MKL_CBWR=COMPATIBLE`` (MKL's conditional numerical reproducibility) unless the environment
already names a mode: MKL reads it once, at its first call, so this must happen before any torch computation;
worker processes inherit it. Without it MKL's float results may differ in the last bits between processes, and a
resumed run would drift from the uninterrupted one (docs/security.md, "Checkpoints and run directories").
"""
import os

os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

__version__ = "0.1.0"
