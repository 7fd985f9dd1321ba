"""tools/gpu_check.sh (issue 36 item 7, the GPU certification check; never run on a GPU yet): its --dry-run on the
CPU lists every step with its command and writes the JSON, the train steps' overrides are ones this tree's config
accepts, a real run here skips the CUDA steps with their reason, and its metrics parser takes medians past step 0."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # its dataclasses look their module up
_spec.loader.exec_module(gc)  # tools/ is a folder of scripts, not a package

STEPS = ["pytest_gpu", "rl_hf_cuda", "rl_vllm_colocated_sleep", "rl_vllm_server", "fsdp2_all_gpus", "fsdp2_resume",
         "activation_checkpointing", "mixed_precision_bf16", "optimizer_offload", "weight_sync_ipc", "lora_vllm",
         "weight_sync_bench", "pytest_vllm", "parity_hf_fp32", "parity_hf_bf16", "parity_vllm_fp32",
         "parity_vllm_bf16"]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "tmp.json"
    proc = subprocess.run([str(REPO / "tools" / "gpu_check.sh"), "--out", str(out), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert out.is_file(), proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


def test_dry_run_lists_every_step_with_its_command(tmp_path: Path):
    proc, report = _run(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["dry_run"] is True and "never run on a GPU" in report["note"]
    assert [s["name"] for s in report["steps"]] == STEPS
    for s in report["steps"]:
        assert s["status"] == "dry-run" and s["command"] and s["timeout_s"] > 0, s
        assert s["would_skip"] is None or isinstance(s["would_skip"], str)
    by = {s["name"]: s for s in report["steps"]}
    assert "-m gpu" in by["pytest_gpu"]["command"] and "-m vllm" in by["pytest_vllm"]["command"]
    assert "model.hidden_size=896" in by["rl_hf_cuda"]["command"] and "model.device=cuda" in by["rl_hf_cuda"]["command"]
    assert "rollout.vllm.sleep=true" in by["rl_vllm_colocated_sleep"]["command"]
    assert "rollout.vllm.mode=server" in by["rl_vllm_server"]["command"]
    assert "torchrun" in by["fsdp2_all_gpus"]["command"] and "distributed.strategy=fsdp2" in by["fsdp2_all_gpus"]["command"]
    resume = by["fsdp2_resume"]["command"]  # preempted after its step-2 checkpoint, then resumed from it
    assert "kill -TERM" in resume and "step_000002/COMPLETE" in resume and "train --resume" in resume, resume
    assert "checkpoint.every=1" in resume and "checkpoint.every=0" not in resume, resume
    assert "rollout.vllm.weight_sync=ipc" in by["weight_sync_ipc"]["command"]
    assert "model.lora.r=8" in by["lora_vllm"]["command"] and "rollout.engine=vllm" in by["lora_vllm"]["command"]
    for name, engine, dtype in [("parity_hf_fp32", "hf", "float32"), ("parity_vllm_bf16", "vllm", "bfloat16")]:
        cmd = by[name]["command"]  # credo parity on CUDA, its JSON report kept (docs/parity.md)
        assert f"parity tiny --engine {engine} --dtype {dtype}" in cmd and "model.device=cuda" in cmd, cmd
        assert f"parity_{engine}_{dtype}.json" in cmd, cmd
    # every train step whose feature is in the tree has overrides the config accepts (a renamed key fails here)
    checked = [s for s in report["steps"] if "config_error" in s]
    assert {"rl_hf_cuda", "rl_vllm_server", "fsdp2_all_gpus", "fsdp2_resume", "optimizer_offload",
            "weight_sync_ipc", "lora_vllm", "parity_hf_fp32", "parity_vllm_bf16"} <= {s["name"] for s in checked}
    assert all(s["config_error"] is None for s in checked), checked
    assert set(report["facts"]) >= {"cuda_available", "gpus", "nvidia_smi", "torch", "vllm"}
    assert sum(report["steps"][i]["timeout_s"] for i in range(len(STEPS))) > report["budget_s"] >= 60


def test_without_cuda_a_real_run_skips_with_the_reason(tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("CUDA here: this checks the CPU behaviour")
    proc, report = _run(tmp_path, "--only", "pytest_gpu", "rl_hf_cuda")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [s["name"] for s in report["steps"]] == ["pytest_gpu", "rl_hf_cuda"]
    for s in report["steps"]:
        assert s["status"] == "skipped" and "no CUDA device" in s["reason"] and s["wall_s"] == 0.0, s


def test_unknown_step_is_refused(tmp_path: Path):
    proc = subprocess.run([str(REPO / "tools" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path / "x.json"),
                           "--only", "no_such_step"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "no_such_step" in proc.stderr


def test_run_parser_takes_medians_past_the_first_step(tmp_path: Path):
    rows = [{"step": 0, "timing_s/step": 9.0, "perf/tokens_per_s": 1.0},
            {"step": 1, "timing_s/step": 1.0, "perf/tokens_per_s": 10.0},
            {"step": 2, "timing_s/step": 3.0, "perf/tokens_per_s": 30.0},
            {"step": 3, "timing_s/step": 2.0, "perf/tokens_per_s": 20.0},
            {"step": 3, "eval/greedy_acc": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "peak_cuda.json").write_text(json.dumps({"peak_allocated_gib": 3.5}))
    figs = gc.parse_run(str(tmp_path))
    assert figs["timing_s/step (median)"] == 2.0 and figs["perf/tokens_per_s (median)"] == 20.0
    assert figs["first_step_s"] == 9.0 and figs["steps_logged"] == 4 and figs["peak_allocated_gib"] == 3.5
    assert gc.parse_pytest("3 passed, 2 skipped, 1 deselected in 4.2s") == {"passed": 3, "skipped": 2,
                                                                           "deselected": 1}
    # benchmarks/vllm_sync.py's output as it prints it (format strings in its main())
    text = ("smollm2 wire only (pack + gloo broadcast to another process, loopback, 32 MiB buckets): median 0.370 s, "
            "1.77 GB/s (min 0.350, max 0.400)\n"
            "smollm2 (RANDOM weights, 621 MiB float32) inprocess: start-up 31.2 s; median of 5 interleaved rounds:\n"
            "  safetensors       3.390 s (min 3.100, max 3.900)   0.19 GB/s of the state  x1.00 vs safetensors\n"
            "  torchdist-1layer  0.106 s (min 0.100, max 0.130)   6.14 GB/s of the state  x31.98 vs safetensors\n"
            "smollm2 (RANDOM weights, 621 MiB float32) server: start-up 40.0 s; median of 5 interleaved rounds:\n"
            "  torchdist         1.070 s (min 1.000, max 1.200)   0.61 GB/s of the state  x12.62 vs safetensors\n"
            "smollm2 torchdist: server / in process = 1.08\n")
    assert gc.parse_bench(text) == {"smollm2 wire only median s": 0.37, "smollm2 inprocess start-up s": 31.2,
                                    "smollm2 inprocess safetensors sync median s": 3.39,
                                    "smollm2 inprocess torchdist-1layer sync median s": 0.106,
                                    "smollm2 server start-up s": 40.0, "smollm2 server torchdist sync median s": 1.07}


def test_parity_parser_reads_the_report(tmp_path: Path):
    report = {"worst_out_of_range": 0.02, "variants": [
        {"name": "trainer:padded", "out_of_range": 0.0, "max_abs": 1e-3},
        {"name": "engine:rows_1", "out_of_range": 0.02, "max_abs": 0.5}]}
    (tmp_path / "p.json").write_text(json.dumps(report))
    assert gc.parse_parity(str(tmp_path / "p.json")) == {
        "worst_out_of_range": 0.02, "trainer:padded out_of_range": 0.0, "trainer:padded max_abs": 1e-3,
        "engine:rows_1 out_of_range": 0.02, "engine:rows_1 max_abs": 0.5}
    assert gc.parse_parity(str(tmp_path / "missing.json")) == {}


def test_feature_steps_are_compared_with_the_plain_run():
    entries = [{"name": "rl_hf_cuda", "status": "passed",
                "figures": {"peak_allocated_gib": 8.0, "timing_s/step (median)": 2.0}},
               {"name": "activation_checkpointing", "status": "passed",
                "figures": {"peak_allocated_gib": 2.0, "timing_s/step (median)": 2.5}},
               {"name": "mixed_precision_bf16", "status": "skipped", "figures": {}}]
    gc.compare_to_baseline(entries)
    assert entries[1]["figures"]["peak_allocated_gib / rl_hf_cuda's"] == 0.25
    assert entries[1]["figures"]["timing_s/step (median) / rl_hf_cuda's"] == 1.25
    assert entries[2]["figures"] == {}
