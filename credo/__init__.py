"""credo: reinforcement-learning post-training of language models with verifiable rewards.

The package root stays light (no torch import) so that reward worker processes start quickly.
"""

__version__ = "0.1.0"
