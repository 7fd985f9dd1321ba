"""Run tracking: per-step metrics (JSONL, TensorBoard), the progress display, rollout dumps."""
