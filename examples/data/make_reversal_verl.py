"""Writes reversal_verl.parquet: reversal.jsonl in verl's RL dataset layout (configs/verl_parquet.yaml's example).

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
