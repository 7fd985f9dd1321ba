"""Issue 17 items 4 and 5: oversized and overlong dataset rows are bad rows; non-finite rewards are verifier failures.

The reward functions below are referenced as ``"tests.data.test_data_security:<name>"`` so that spawned reward workers
import them; this module keeps torch out of its top-level imports for that reason.
"""
from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from credo.types import Example, RewardResult, Trajectory

REPO = Path(__file__).resolve().parents[2]
HERE = "tests.data.test_data_security"
BIG = 5_000_000  # bytes of the oversized row's prompt (over the 1 MiB default cap)


# ------------------------------------------------------------------------------ reward functions (workers import)


def nonfinite_by_response(response: str, example: Example, **_: object):
    """Behaviour chosen by the response: nan, inf, -inf, None, a RewardResult with a NaN score, else 1.0/0.0."""
    table = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "none": None,
             "rr_nan": RewardResult(score=float("nan"), correct=True), "rr_none": RewardResult(score=None)}
    if response in table:
        return table[response]
    return 1.0 if response == example.answer else 0.0


def nan_for_even_lengths(response: str, example: Example, **_: object) -> float:
    """NaN for responses of even length (about half of a random policy's), else length / 8 capped at 1."""
    return float("nan") if len(response) % 2 == 0 else min(len(response) / 8, 1.0)


def huge(response: str, example: Example, **_: object) -> float:
    return 1e308  # finite, but 10 * 1e308 overflows to inf


# ------------------------------------------------------------------------------------------------ helpers


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _traj(text: str) -> Trajectory:
    return Trajectory(example=Example("p", "a"), group_id=0, prompt_ids=[1], response_ids=[5] * len(text),
                      rollout_logprobs=[0.0] * len(text), response_mask=[1] * len(text), finish_reason="eos",
                      response_text=text)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "credo.cli.main", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _tiny(context: int):
    from credo.config.schema import ModelConfig
    from credo.models import build_model

    return build_model(ModelConfig(hidden_size=32, intermediate_size=64, max_position_embeddings=context))


# ============================================================================ item 4: row byte cap


def test_five_megabyte_jsonl_row_is_a_bad_row_named_by_file_and_line(tmp_path):
    from credo.data.files import BadRowsWarning, DatasetError, load_dataset_file

    path = _write_jsonl(tmp_path / "big.jsonl", [{"prompt": "p1", "answer": "a"}, {"prompt": "p2", "answer": "b"},
                                                 {"prompt": "x" * BIG, "answer": "c"}, {"prompt": "p4", "answer": "d"}])
    with pytest.warns(BadRowsWarning, match="big.jsonl:3: row is"):
        ds = load_dataset_file(path)
    assert [ex.prompt for ex in ds.examples] == ["p1", "p2", "p4"]  # the row after the big one still loads
    assert ds.lines == [1, 2, 4]
    # the row is {"prompt": "xxx...", "answer": "c"}: 12 + BIG + 17 = BIG + 29 bytes without its line break
    size = len(json.dumps({"prompt": "x" * BIG, "answer": "c"}))
    assert size == BIG + 29
    assert [(b.path, b.line, b.reason) for b in ds.bad_rows] == [
        (str(path), 3, f"row is {size:,} bytes, over max_row_bytes=1,048,576")]
    with pytest.raises(DatasetError, match=r"big\.jsonl:3: row is 5,000,029 bytes, over max_row_bytes=1,048,576"):
        load_dataset_file(path, on_bad_row="error")


def test_oversized_line_is_read_in_bounded_chunks():
    from credo.data.files import iter_lines

    class Recording(io.BytesIO):
        biggest = 0

        def readline(self, size=-1):
            assert size > 0, "an unbounded readline would hold the whole line"
            out = super().readline(size)
            Recording.biggest = max(Recording.biggest, len(out))
            return out

    f = Recording(b"ab\n" + b"y" * BIG + b"\ncd")  # 3 lines; the last one has no line break
    assert list(iter_lines(f, 100)) == [(b"ab", 2), (None, BIG), (b"cd", 2)]
    assert Recording.biggest <= 1 << 20  # never more than one 1 MiB chunk at a time
    # the cap is inclusive: a line of exactly max_bytes is kept, one byte more is not
    assert list(iter_lines(io.BytesIO(b"12345\n123456\n"), 5)) == [(b"12345", 5), (None, 6)]


def test_row_byte_cap_is_configurable_and_covers_parquet_and_preference_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from credo.config.schema import TaskConfig
    from credo.methods.reward_models.pairs import load_pairs
    from credo.data.source import load_task_data

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)] + [{"prompt": "z" * 300, "answer": "5"}]
    jsonl = _write_jsonl(tmp_path / "d.jsonl", rows)
    data = load_task_data(TaskConfig(name="file", train_file=str(jsonl), eval_fraction=0.0, max_row_bytes=200),
                          seed=0)
    # {"prompt": "zzz...", "answer": "5"}: 12 + 300 + 17 = 329 bytes
    assert len(data.train) == 5 and [(b.line, b.reason) for b in data.bad_rows] == [
        (6, "row is 329 bytes, over max_row_bytes=200")]
    assert data.origins["d.jsonl:2"] == (str(jsonl), 2)

    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    data = load_task_data(TaskConfig(name="file", train_file=str(parquet), eval_fraction=0.0, max_row_bytes=200),
                          seed=0)
    assert len(data.train) == 5 and [b.line for b in data.bad_rows] == [6]  # measured as its JSON text: 329 bytes

    prefs = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"},
                                                {"prompt": "p", "chosen": "a" * BIG, "rejected": "b"}])
    pairs, bad = load_pairs(prefs)
    assert len(pairs) == 1 and [(b.line, b.reason.startswith("row is 5,000,0")) for b in bad] == [(2, True)]


# ============================================================================ item 4: prompt length vs context


def _overlong_file(tmp_path: Path) -> Path:
    # credo's tokenizer: one token per character plus <bos>. Context 64, max_new_tokens 8: a prompt fits when
    # len + 1 + 8 <= 64, i.e. up to 55 characters.
    rows = [{"prompt": "a" * 10, "answer": "1"}, {"prompt": "b" * 55, "answer": "2"},  # 56 + 8 = 64: fits
            {"prompt": "c" * 56, "answer": "3"},  # 57 + 8 = 65 > 64: too long
            {"prompt": "d" * 3000, "answer": "4"},  # the 3,000-character prompt
            {"prompt": "e" * 20, "answer": "5"}]
    return _write_jsonl(tmp_path / "long.jsonl", rows)


def test_prompts_longer_than_the_context_are_skipped_and_counted(tmp_path, caplog):
    from credo.config.schema import TaskConfig
    from credo.data.source import drop_overlong, load_task_data, model_context

    model, tok = _tiny(64)
    assert model_context(model) == 64
    path = _overlong_file(tmp_path)
    cfg = TaskConfig(name="file", train_file=str(path), eval_fraction=0.0)
    data = drop_overlong(load_task_data(cfg, seed=0), tok, cfg, context=model_context(model), max_new_tokens=8)
    assert [ex.answer for ex in data.train] == ["1", "2", "5"]
    assert [(b.path, b.line, b.reason) for b in data.bad_rows] == [
        (str(path), 3, "prompt is 57 tokens + rollout.max_new_tokens=8 = 65, over the model's "
                       "max_position_embeddings=64"),
        (str(path), 4, "prompt is 3001 tokens + rollout.max_new_tokens=8 = 3009, over the model's "
                       "max_position_embeddings=64")]
    assert "skipped 2 rows longer than the model's context" in caplog.text

    with pytest.raises(ValueError, match=r"long\.jsonl:3: prompt is 57 tokens"):
        drop_overlong(load_task_data(cfg, seed=0), tok, TaskConfig(name="file", train_file=str(path),
                      eval_fraction=0.0, on_bad_row="error"), context=64, max_new_tokens=8)
    with pytest.raises(ValueError, match="more than max_bad_rows=1"):
        drop_overlong(load_task_data(cfg, seed=0), tok, TaskConfig(name="file", train_file=str(path),
                      eval_fraction=0.0, max_bad_rows=1), context=64, max_new_tokens=8)


def test_builtin_task_with_too_long_prompts_fails_with_a_clear_error():
    from credo.config.schema import TaskConfig
    from credo.data.source import drop_overlong, load_task_data

    _, tok = _tiny(64)
    # "rev " + 60 letters + "=" = 65 characters + <bos> = 66 tokens > 64 before any response token
    cfg = TaskConfig(name="reversal", params={"min_len": 60, "max_len": 60}, train_size=4, eval_size=2)
    with pytest.raises(ValueError, match=r"task 'reversal' .*: train example reversal/train/0: prompt is 66 tokens "
                                         r"\+ rollout.max_new_tokens=8 = 74, over the model's max_position_emb"):
        drop_overlong(load_task_data(cfg, seed=0), tok, cfg, context=64, max_new_tokens=8)
    ok = TaskConfig(name="reversal", params={"min_len": 3, "max_len": 6}, train_size=4, eval_size=2)
    data = load_task_data(ok, seed=0)
    assert drop_overlong(data, tok, ok, context=64, max_new_tokens=8) is data  # nothing too long: unchanged


def test_cli_train_skips_overlong_rows_and_error_mode_names_them(tmp_path):
    from tests.conftest import TINY_COLD

    path = _write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"rev {'ab' * (i % 3 + 1)}=", "answer": "x"}
                                                   for i in range(12)] + [{"prompt": "q" * 3000, "answer": "y"}])
    args = [*TINY_COLD, "task.name=file", f"task.train_file={path}", "task.eval_fraction=0.2", "train.steps=1",
            "warm_start.enabled=false", "eval.every=0", "log.report=false", "log.tensorboard=false",
            "model.max_position_embeddings=64"]
    run = tmp_path / "run"
    proc = _cli("train", "--run-dir", str(run), *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train.jsonl:13: prompt is 3001 tokens" in proc.stderr
    assert json.loads((run / "summary.json").read_text())["data/bad_rows"] == 1
    proc = _cli("train", "--run-dir", str(tmp_path / "err"), *args, "task.on_bad_row=error")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"credo: error: {path}:13: prompt is 3001 tokens + rollout.max_new_tokens=8 = 3009, over the model's "
        "max_position_embeddings=64")


# ============================================================================ item 5: non-finite rewards


CASES = ["nan", "inf", "-inf", "none", "rr_nan", "rr_none", "a", "b"]


@pytest.mark.parametrize("executor", ["inline", "process"])
def test_nonfinite_user_rewards_are_failures_and_stats_do_not_crash(executor):
    from credo.rewards import RewardRunner
    from credo.train.stats import rollout_metrics

    with RewardRunner(f"{HERE}:nonfinite_by_response", failure_score=-0.5, workers=1, executor=executor) as runner:
        results = runner.score(CASES, [Example("p", "a")] * len(CASES))
    bad, good = results[:6], results[6:]
    for case, r in zip(CASES, bad):
        assert (r.score, r.failed, r.correct) == (-0.5, True, False), case
        assert r.error.startswith("non-finite score: "), (case, r.error)
    assert [(r.score, r.failed, r.correct) for r in good] == [(1.0, False, True), (0.0, False, False)]
    assert runner.stats["failures"] == 6

    m = rollout_metrics([_traj(c) for c in CASES], results)
    # scores: six failures at -0.5, then 1.0 and 0.0: mean = (6 * -0.5 + 1.0 + 0.0) / 8 = -2 / 8 = -0.25
    assert m["reward/mean"] == pytest.approx(-0.25)
    # deviations: 0.25 (six times), 1.25, 0.25: variance = (7 * 0.0625 + 1.5625) / 8 = 2.0 / 8 = 0.25, std 0.5
    assert m["reward/std"] == pytest.approx(0.5)
    assert m["reward/verifier_failures"] == 6 and m["reward/nonfinite"] == 6
    assert m["acc/mean"] == 1 / 8


def test_stats_never_crash_on_raw_nonfinite_scores():
    from credo.train.stats import rollout_metrics

    raw = [RewardResult(float("nan")), RewardResult(float("inf")), RewardResult(None), RewardResult(2.0),
           RewardResult(4.0)]
    m = rollout_metrics([_traj("x")] * len(raw), raw)
    # over the finite scores 2 and 4: mean 3, population std 1
    assert (m["reward/mean"], m["reward/std"], m["reward/max"], m["reward/min"]) == (3.0, 1.0, 4.0, 2.0)
    assert m["reward/nonfinite"] == 3
    huge_scores = rollout_metrics([_traj("x")] * 2, [RewardResult(1e308), RewardResult(1e308)])
    assert huge_scores["reward/max"] == 1e308  # fmean's fsum overflows here; the fallback does not raise
    none = rollout_metrics([_traj("x")], [RewardResult(float("nan"))])
    assert (none["reward/mean"], none["reward/std"], none["reward/nonfinite"]) == (0.0, 0.0, 1)


def test_nonfinite_failure_score_is_refused():
    from credo.rewards import RewardRunner

    with pytest.raises(ValueError, match="failure_score must be a finite number"):
        RewardRunner("exact_match", failure_score=float("nan"))


def test_mixed_reward_overflow_is_a_failure():
    from credo.rewards import RewardRunner
    from credo.rewards.mixed import MixedRunner

    def runner(name: str) -> RewardRunner:
        return RewardRunner(name, executor="inline", failure_score=-1.0)

    with MixedRunner([("exact_match", 1.0, runner("exact_match")), ("huge", 10.0, runner(f"{HERE}:huge"))]) as mixed:
        (r,) = mixed.score(["a"], [Example("p", "a")])
    # 1.0 * 1.0 + 10.0 * 1e308 = inf: a failure with the failure score; accuracy still the task verifier's
    assert (r.score, r.failed, r.correct) == (-1.0, True, True)
    assert r.error == "non-finite score: inf (weighted sum)"
    with MixedRunner([("exact_match", 1.0, runner("exact_match")),
                      ("nan", 0.5, runner(f"{HERE}:nonfinite_by_response"))]) as mixed:
        (r,) = mixed.score(["nan"], [Example("p", "a")])
    # exact_match 0.0, the NaN component fails with -1.0: 1.0 * 0.0 + 0.5 * -1.0 = -0.5
    assert (r.score, r.failed) == (-0.5, True) and r.error == "non-finite score: nan"


class _ScoresHandler(BaseHTTPRequestHandler):
    # json.loads accepts NaN and Infinity; 10**400 is a JSON integer too large for a float
    body = b'{"scores": [null, NaN, Infinity, "0.5", 1' + b"0" * 400 + b', 0.25, -1000.0]}'

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_reward_model_endpoint_nonfinite_scores_fail_only_their_own_results():
    from credo.rewards import RewardRunner
    from credo.train.stats import rollout_metrics

    server = HTTPServer(("127.0.0.1", 0), _ScoresHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with RewardRunner("reward_model", fn_kwargs={"url": url, "transform": "sigmoid", "timeout_s": 5.0,
                                                     "retries": 0}, failure_score=-2.0) as runner:
            results = runner.score(["r"] * 7, [Example("p", "a")] * 7)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    # null, NaN, Infinity, a string, 10**400: each fails alone; the others are scored
    assert [(r.score, r.failed) for r in results[:5]] == [(-2.0, True)] * 5
    assert all(r.error.startswith("non-finite score: ") for r in results[:5])
    assert not results[5].failed and results[5].score == pytest.approx(1 / (1 + math.exp(-0.25)))
    assert not results[6].failed and results[6].score == pytest.approx(0.0, abs=1e-300)  # no exp overflow
    m = rollout_metrics([_traj("r")] * 7, results)
    assert m["reward/nonfinite"] == 5 and m["reward/verifier_failures"] == 5


def test_cli_train_with_a_nan_reward_completes_and_records_the_failures(tmp_path):
    from credo.tracking.metrics import read_metrics
    from tests.conftest import TINY_COLD

    run = tmp_path / "run"
    proc = _cli("train", "--run-dir", str(run), *TINY_COLD, "train.steps=2", "warm_start.enabled=false",
                "eval.every=0", "log.report=false", "log.tensorboard=false", "reward.failure_score=-1.0",
                f"reward.name={HERE}:nan_for_even_lengths")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # 16 responses a step; a random policy gives some of even length (NaN) and some of odd length
        assert 0 < r["reward/nonfinite"] == r["reward/verifier_failures"] < 16
        assert math.isfinite(r["reward/mean"]) and -1.0 <= r["reward/min"] < 0.0 <= r["reward/max"] <= 1.0
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
