"""Writes reversal.jsonl in two peers' layouts: reversal_verl.parquet (verl's RL dataset layout,
configs/verl_parquet.yaml's example) and reversal_trl.jsonl (TRL's conversational prompt-only layout with a
solution column, configs/trl_conversational.yaml's example).

    python examples/data/make_reversal_verl.py
"""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

here = Path(__file__).parent
rows = [json.loads(line) for line in (here / "reversal.jsonl").read_text().splitlines() if line.strip()]
pq.write_table(pa.Table.from_pylist([
    {"data_source": "reversal", "prompt": [{"role": "user", "content": r["prompt"]}], "ability": "string",
     "reward_model": {"style": "rule", "ground_truth": str(r["answer"])}, "extra_info": {"split": "train", "index": i}}
    for i, r in enumerate(rows)]), here / "reversal_verl.parquet")
(here / "reversal_trl.jsonl").write_text("".join(
    json.dumps({"prompt": [{"role": "user", "content": r["prompt"]}], "solution": str(r["answer"])}) + "\n"
    for r in rows))
