"""credo.report.evidence: docs/evidence.md's table comes from the JSON files it cites, and the verdict rule."""
import json
import re
from pathlib import Path

import pytest

from credo.report.evidence import BEGIN, END, embed, load_rows, row_result
from credo.report.stats import metric_block, write_compare_json

REPO = Path(__file__).resolve().parents[2]


def test_docs_evidence_table_is_in_sync_with_its_data():
    doc = (REPO / "docs" / "evidence.md").read_text()
    rows = load_rows(REPO / "docs" / "evidence" / "rows")
    assert embed(doc, rows, REPO) == doc, "run: python -m credo.report.evidence"
    verdicts = re.findall(r"\| \*\*([a-z ]+)\*\*", doc.split(BEGIN)[1].split(END)[0])
    said = re.search(r"Verdicts: (\d+) shown, (\d+) opposite, (\d+) not shown, (\d+) not\s+measured", doc)
    assert said and [int(x) for x in said.groups()] == [verdicts.count(v) for v in
                                                       ("shown", "opposite", "not shown", "not measured")]
    for row in [r for r in rows if r.get("data") is not None]:  # every cited file is a compare JSON
        assert json.loads((REPO / row["data"]).read_text())["format"] == "credo.compare/1", row["data"]


def _row(tmp_path, values, expected):
    write_compare_json(tmp_path / "docs" / "evidence" / "data" / "x.json", name="x", command="c", baseline="base",
                       seeds=range(5), metrics={"m@final": metric_block(values, "base")})
    return {"method": "M", "claim": "c", "measured": "m", "data": "docs/evidence/data/x.json", "metric": "m@final",
            "arm": "new", "expected": expected, "command": "c", "_source": "rows.yaml"}


@pytest.mark.parametrize("new,expected,verdict", [
    ([2, 3, 4, 5, 6], "higher", "shown"),  # every seed +1: interval (1, 1)
    ([2, 3, 4, 5, 6], "lower", "opposite"),
    ([0, 3, 2, 5, 4], "higher", "not shown"),  # diffs (-1, 1, -1, 1, -1): interval holds 0
    ([1, 2, 3, 4, 5], "same", "shown"),  # diffs all 0: interval (0, 0) within margin 0
    ([0, 3, 2, 5, 4], "same", "not shown"),  # holds 0 but reaches past the margin
    ([2, 3, 4, 5, 6], "same", "opposite"),  # excludes 0: a difference where none was expected
])
def test_verdicts(tmp_path, new, expected, verdict):
    base = [1.0, 2.0, 3.0, 4.0, 5.0]
    r = row_result(_row(tmp_path, {"base": base, "new": [float(x) for x in new]}, expected), tmp_path)
    assert r["verdict"] == verdict and r["n"] == 5 and r["base_mean"] == 3.0


def test_a_row_citing_a_missing_metric_is_an_error(tmp_path):
    row = _row(tmp_path, {"base": [1.0] * 5, "new": [1.0] * 5}, "higher")
    with pytest.raises(ValueError, match="no metric"):
        row_result({**row, "metric": "other@final"}, tmp_path)
    with pytest.raises(ValueError, match="no .*block"):
        embed("no markers", [], tmp_path)
    assert embed(f"a\n{BEGIN}\nold\n{END}\nb", [], tmp_path).startswith(f"a\n{BEGIN}\n| method |")


def test_an_unmeasured_row_needs_its_reason(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "a.yaml").write_text("- {method: M, claim: c, measured: not measured, data: null}\n")
    with pytest.raises(ValueError, match="missing note"):
        load_rows(rows)
    (rows / "a.yaml").write_text("- {method: M, claim: c, measured: not measured, data: null, note: needs a GPU}\n")
    out = embed(f"{BEGIN}\n{END}", load_rows(rows), tmp_path)
    assert "**not measured**: needs a GPU" in out
