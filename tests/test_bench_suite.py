"""benchmarks/suite.py: the step split from hand-made metrics rows, --compare's ratios and intervals on hand-made
JSONs, the docs table and its markers, the process-tree RSS poller on a child that allocates memory, and one
workload end to end (the sandbox's, a few seconds; the demo's `credo train` run is marked slow)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import suite_report as report  # noqa: E402

from tests.sandbox_util import ONE_POOL_AT_A_TIME, isolation_missing  # noqa: E402

ROW = {"step": 3, "timing_s/step": 2.0, "timing_s/gen": 0.8, "timing_s/gen_baseline": 0.1, "timing_s/reward": 0.05,
       "timing_s/old_logprob": 0.2, "timing_s/ref": 0.15, "timing_s/adv": 0.01, "timing_s/update": 0.5,
       "timing_s/update_critic": 0.1, "timing_s/eval": 9.0, "timing_s/rl_wall_total": 40.0,
       "perf/tokens_per_s": 1000.0, "perf/gen_tokens_per_s": 2000.0}


def test_step_split_groups_the_stage_timers_and_leaves_the_rest_in_other():
    s = report.step_split(ROW)
    assert s["generation"] == pytest.approx(0.9) and s["reward"] == 0.05
    assert s["logprob"] == pytest.approx(0.35) and s["update"] == pytest.approx(0.6) and s["sync"] == 0.0
    # other = 2.0 - (0.9 + 0.05 + 0.35 + 0.6): adv and untimed work; eval and the running total are not in a step
    assert s["other"] == pytest.approx(0.1) and s["step"] == 2.0


def test_timed_rows_drop_the_step0_row_and_the_warmup():
    rows = [{"step": 0, "eval/greedy_acc": 0.1}] + [dict(ROW, step=i, **{"timing_s/step": float(i)})
                                                     for i in range(1, 5)]
    assert [r["step"] for r in report.timed_rows(rows, 1)] == [2, 3, 4]


def test_train_summary_medians_tokens_and_mfu():
    rows = [dict(ROW, **{"timing_s/step": t, "timing_s/update": u}) for t, u in ((2.0, 0.5), (4.0, 1.0), (3.0, 0.5))]
    out = report.train_summary(rows, params=1000, peak_flops=1e9, ppo_epochs=2)
    assert out["median"]["step"] == 3.0 and out["tokens_per_s"] == 1000.0 and len(out["steps"]) == 3
    # 6 N T epochs / update / peak with T = tokens/s x step: 6e3 * (2000, 4000, 3000) * 2 / (0.5, 1, 0.5) / 1e9
    assert out["mfu"] == pytest.approx(0.048)
    assert report.train_summary(rows)["mfu"] is None  # no parameter count: no MFU


def doc(commit: str, scale: float, n: int = 6, **extra) -> dict:
    steps = [{"step": scale * (1 + 0.01 * i), "generation": scale * 0.5, "update": 0.3, "sync": 0.0}
             for i in range(n)]
    return {"suite_version": 1, "commit": commit, "mode": "quick", "date": "d", "machine": {"cores": 2},
            "workloads": {"demo": {"status": "ok", "steps": steps, "median": report.medians(steps),
                                   "peak_rss_mb": 400.0 * scale, "tokens_per_s": 100 / scale, "mfu": 0.1},
                          "vllm_cpu": {"status": "not run", "reason": "no vllm"}, **extra}}


def test_compare_ratios_and_intervals_of_two_suite_jsons(tmp_path, capsys):
    a, b = doc("a" * 40, 1.0), doc("b" * 40, 0.5)
    rows = report.compare_docs(a, b, boot=200)
    by = {(r["workload"], r.get("component")): r for r in rows}
    step = by[("demo", "step")]
    assert step["ratio"] == pytest.approx(0.5) and step["lo"] <= 0.5 <= step["hi"] and step["hi"] < 0.52
    assert by[("demo", "generation")]["ratio"] == pytest.approx(0.5)
    assert (by[("demo", "generation")]["lo"], by[("demo", "generation")]["hi"]) == (0.5, 0.5)  # constant series
    assert by[("demo", "update")]["ratio"] == 1.0
    assert ("demo", "sync") not in by  # zero on A: no ratio
    assert by[("demo", "peak_rss_mb")]["ratio"] == 0.5 and by[("demo", "peak_rss_mb")]["lo"] is None
    assert by[("vllm_cpu", None)]["status_a"] == "not run"
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert suite.main(["--compare", str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"demo step: 0\.50 x \[0\.4\d, 0\.5\d\]", out) and "demo generation: 0.50 x [0.50, 0.50]" in out
    assert "vllm_cpu: not compared (A not run, B not run)" in out and "drift" in out


def test_table_and_write_docs_replace_only_between_the_markers(tmp_path):
    d = doc("c" * 40, 1.0, sandbox={"status": "ok", "steps": [{"run_serial": 0.05}], "median": {"run_serial": 0.05},
                                    "peak_rss_mb": 100.0})
    text = report.table(d)
    lines = text.splitlines()
    assert lines[2].startswith("| workload | status | step | generation | reward | logprob | update | sync | other")
    demo = next(x for x in lines if x.startswith("| demo |"))
    assert "| ok | 1.025 | 0.500 |" in demo and "| 10.0% |" in demo and "| 400 |" in demo
    assert "| not run: no vllm |" in next(x for x in lines if x.startswith("| vllm_cpu |"))
    assert "run_serial 0.05 s" in next(x for x in lines if x.startswith("| sandbox |"))
    page = tmp_path / "performance.md"
    page.write_text(f"# P\nintro\n{report.START}\nold table\n{report.END}\nrest\n")
    report.write_docs(d, page)
    new = page.read_text()
    assert new.startswith("# P\nintro\n") and new.endswith(f"{report.END}\nrest\n") and "old table" not in new
    assert text in new
    with pytest.raises(ValueError, match="markers"):
        report.replace_table("no markers here", text)


def test_merge_pools_the_rounds():
    r1 = {"status": "ok", "steps": [{"step": 1.0}], "median": {"step": 1.0}, "peak_rss_mb": 10.0,
          "tokens_per_s": 5.0, "wall_s": 1}
    r2 = {"status": "ok", "steps": [{"step": 3.0}, {"step": 2.0}], "median": {"step": 2.5}, "peak_rss_mb": 30.0,
          "tokens_per_s": 7.0, "wall_s": 1}
    m = suite.merge([r1, r2])
    assert m["median"] == {"step": 2.0} and m["peak_rss_mb"] == 30.0 and m["tokens_per_s"] == 6.0
    assert m["rounds"] == 2 and len(m["steps"]) == 3
    assert suite.merge([r1, {"status": "error", "reason": "exit 1"}])["status"] == "error"


def test_rss_poller_sees_a_child_process_tree_allocate():
    # a child that starts a grandchild; the grandchild holds 200 MB of touched memory for a while
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time; b = bytearray(200 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(1.5)'])")
    proc = subprocess.Popen([sys.executable, "-c", code])
    with suite.RssPoller(proc.pid, interval=0.02) as rss:
        proc.wait(timeout=60)
    assert rss.samples > 5
    assert rss.peak > 200 * 2**20  # the grandchild's 200 MB and both interpreters


def test_run_process_records_errors_and_timeouts(tmp_path):
    res = suite.run_process([sys.executable, "-c", "import sys; print('x'); sys.exit(3)"], tmp_path, 30)
    assert (res["status"], res["returncode"], res["stdout"]) == ("error", 3, "x\n")
    t0 = time.perf_counter()
    res = suite.run_process([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                             "time.sleep(60)"], tmp_path, 1.0)
    assert res["status"] == "timeout" and time.perf_counter() - t0 < 30  # the grandchild was killed too


def test_unavailable_workloads_are_recorded_not_dropped(tmp_path):
    args = suite.parse(["--quick", "--only", "vllm_cpu", "--vllm-python", sys.executable])
    rec = suite.run_workload(next(w for w in suite.WORKLOADS if w.name == "vllm_cpu"), suite.ROOT, args, tmp_path)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert rec["status"] == "not run" and "not importable" in rec["reason"]
    args = suite.parse(["--quick"])
    assert "no --vllm-python" in suite.unavailable(next(w for w in suite.WORKLOADS if w.name == "vllm_cpu"), args)


def test_workload_commands_run_credo_train_in_the_tree():
    demo = next(w for w in suite.WORKLOADS if w.name == "demo")
    argv = demo.argv("quick", "py", Path("/r"))
    assert argv[:7] == ["py", "-m", "credo.cli.main", "-q", "train", "--run-dir", "/r"]
    assert "train.steps=8" in argv and "train.skip_zero_advantage=false" in argv
    assert "train.steps=25" in demo.argv("full", "py", Path("/r"))
    maze = next(w for w in suite.WORKLOADS if w.name == "agent_maze").argv("quick", "py", Path("/r"))
    assert maze[7:9] == ["--config", "agent_maze"]


@ONE_POOL_AT_A_TIME
def test_sandbox_workload_end_to_end(tmp_path):
    """The sandbox workload through the suite's own runner (a few seconds); skipped where isolation cannot exist."""
    if isolation_missing():
        pytest.skip(f"sandbox isolation unavailable on this machine: {isolation_missing()}")
    out = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, str(suite.HERE / "suite.py"), "--quick", "--only", "sandbox", "--json",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    w = data["workloads"]["sandbox"]
    assert w["status"] == "ok" and len(w["steps"]) == 5 and w["peak_rss_mb"] > 0
    assert set(w["median"]) == {"run_serial", "run_parallel", "judge_test"} and w["median"]["run_serial"] > 0
    assert data["machine"]["cores"] >= 1 and len(data["machine"]["load_after"]) == 3 and data["mode"] == "quick"


@pytest.mark.slow
def test_demo_workload_end_to_end(tmp_path, monkeypatch):
    """The demo workload, 2 RL steps (1 timed), through `credo train` in this tree."""
    demo = next(w for w in suite.WORKLOADS if w.name == "demo")
    monkeypatch.setattr(suite, "WORKLOADS", (suite.Workload("demo", "train", (2, 2), (1, 1), None,
                                                            ("warm_start.steps=2", "eval.size=2")),))
    out = tmp_path / "d.json"
    assert suite.main(["--quick", "--json", str(out)]) == 0
    w = json.loads(out.read_text())["workloads"]["demo"]
    assert w["status"] == "ok" and len(w["steps"]) == 1 and w["median"]["step"] > 0
    assert w["median"]["generation"] > 0 and w["tokens_per_s"] > 0 and w["mfu"] > 0 and w["params"] > 0
    assert demo.name == "demo"


def test_ab_interleaves_the_two_trees_round_by_round(monkeypatch, tmp_path):
    calls = []

    def fake(w, tree, args, tmp):
        calls.append((w.name, tree.name))
        t = 1.0 if tree.name == "a" else 0.5
        return {"status": "ok", "steps": [{"step": t}, {"step": t}], "median": {"step": t}, "peak_rss_mb": 1.0,
                "wall_s": 0.0}

    monkeypatch.setattr(suite, "run_workload", fake)
    args = suite.parse(["--quick", "--only", "demo", "sandbox", "--ab", "a", "b", "--rounds", "2"])
    docs = suite.run_ab(tmp_path / "a", tmp_path / "b", args)
    assert calls == [("demo", "a"), ("demo", "b"), ("sandbox", "a"), ("sandbox", "b"),
                     ("demo", "b"), ("demo", "a"), ("sandbox", "b"), ("sandbox", "a")]
    assert len(docs["A"]["workloads"]["demo"]["steps"]) == 4 and docs["B"]["workloads"]["demo"]["rounds"] == 2
    assert docs["A"]["workloads"]["demo"]["wall_s"] == 0.0
    rows = report.compare_docs(docs["A"], docs["B"], boot=50)
    assert "interleaved in 2 round(s)" in "\n".join(report.compare_lines(docs["A"], docs["B"], rows))
    assert next(r for r in rows if r["workload"] == "demo" and r["component"] == "step")["ratio"] == 0.5
