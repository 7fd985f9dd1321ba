"""Issue 17, items 12, 14, 16b, 16c: one-line early CLI errors that leave no run directory, `credo rm serve`'s
request bounds, fair batching and bearer token, the vLLM engine's temporary folder, preset-relative data paths."""
from __future__ import annotations

import gc
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from credo.algo import ADVANTAGE_ESTIMATORS
from credo.cli.main import main
from credo.config import ConfigError, load_config
from tests.conftest import TINY, TINY_RUN
from tests.env_util import free_port, post_json

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path, pythonpath: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    paths = [str(REPO)] + ([str(pythonpath)] if pythonpath else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}
    env.pop("CREDO_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "credo.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _unwritable_dir(tmp_path: Path) -> Path:
    """A folder in which mkdir raises PermissionError: a read-only folder, or for root (who ignores modes) /sys."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        return ro
    try:
        os.mkdir("/sys/credo-probe")
    except PermissionError:
        return Path("/sys")
    except OSError:
        pass
    else:
        os.rmdir("/sys/credo-probe")
    pytest.skip("no folder refuses mkdir to this user")


# ------------------------------------------------------------------------------------ item 14: early errors


def _corrupt_model(tmp_path: Path) -> list[str]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 32,')  # cut short: not JSON
    return [f"model.path={model}"]


def _reward_module(tmp_path: Path, source: str) -> list[str]:
    (tmp_path / "bad_reward_mod.py").write_text(source)
    return ["reward.name=bad_reward_mod:score"]


CASES = {
    "gae_without_critic": (lambda p: ["algo.advantage=gae", "critic.enabled=false"], "critic.enabled"),
    "passk_group_of_one": (lambda p: ["algo.advantage=grpo_passk", "rollout.group_size=1"], "rollout.group_size"),
    "grpo_group_of_one": (lambda p: ["rollout.group_size=1"], "rollout.group_size"),
    "vllm_cannot_run": (lambda p: ["rollout.engine=vllm"], "rollout.engine"),
    "cuda_without_cuda": (lambda p: ["model.device=cuda"], "model.device"),
    "corrupt_model_config": (_corrupt_model, "model.path"),
    "reward_syntax_error": (lambda p: _reward_module(p, "def score(response, example):\n    return (\n"),
                            "reward.name"),
    "reward_raises_on_import": (lambda p: _reward_module(p, "raise RuntimeError('no licence server')\n"),
                                "reward.name"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_input_errors_are_one_line_exit_2_and_leave_no_run_dir(case, tmp_path):
    """Each error of item 14 through the real CLI: exit 2, one stderr line naming the key, no run directory."""
    if case == "vllm_cannot_run":
        from credo.rollout.vllm_engine import vllm_available

        if vllm_available():
            pytest.skip("vLLM can run here")
    if case == "cuda_without_cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    make, key = CASES[case]
    run = tmp_path / "out" / "run"
    proc = _cli("train", "--run-dir", str(run), *TINY_RUN, *make(tmp_path), cwd=tmp_path, pythonpath=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "\n" not in err and err.startswith("credo: config error: ") and key in err, err
    assert "Traceback" not in proc.stderr
    assert not run.exists() and not (tmp_path / "out").exists()


def test_unwritable_run_dir_is_one_line_exit_2(tmp_path):
    parent = _unwritable_dir(tmp_path)
    run = parent / "credo-run"
    proc = _cli("train", "--run-dir", str(run), *TINY_RUN, cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "\n" not in err and "--run-dir" in err and str(run) in err, err
    assert not run.exists()


def test_data_error_after_the_preflight_leaves_no_run_dir(tmp_path):
    """A data file with a bad row under on_bad_row=error fails when the data is read (exit 1, one line), and the
    run directory created just before is removed again; a run directory that existed before is kept."""
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join([json.dumps({"prompt": f"rev {s}=", "answer": s[::-1]}) for s in ("ab", "ba", "cd")]
                              + ["{not json"]) + "\n")
    args = [*TINY_RUN, "task.name=file", f"task.train_file={data}", "task.on_bad_row=error", "train.steps=1"]
    run = tmp_path / "run"
    proc = _cli("train", "--run-dir", str(run), *args, cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 1 and "\n" not in err and f"{data}:4" in err, proc.stderr[-2000:]
    assert not run.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert _cli("train", "--run-dir", str(mine), *args, cwd=tmp_path).returncode == 1
    assert (mine / "notes.txt").read_text() == "keep"


def test_data_error_with_a_generated_run_name_leaves_no_run_dir(tmp_path):
    """Without --run-dir or run_name the CLI chooses the TASK-LOSS-TIMESTAMP name itself, so the folder a failed
    start made is removed too (it was left behind before)."""
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "rev ab=", "answer": "ba"}) + "\n{not json\n")
    out = tmp_path / "out"
    proc = _cli("train", *TINY_RUN, "task.name=file", f"task.train_file={data}", "task.on_bad_row=error",
                "train.steps=1", f"output_dir={out}", "run_name=null", cwd=tmp_path)
    assert proc.returncode == 1 and f"{data}:2" in proc.stderr, proc.stderr[-2000:]
    assert not out.exists() or list(out.iterdir()) == []


def test_missing_data_file_is_refused_before_the_run_dir(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["-q", "train", "--run-dir", str(run), "task.name=file", f"task.train_file={tmp_path / 'nope.jsonl'}"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == f"credo: error: task.train_file: no such file: {tmp_path / 'nope.jsonl'}"
    assert not run.exists()


def test_credo_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CREDO_DEBUG", "1")
    assert main(["train", "--run-dir", str(tmp_path / "r"), "rollout.group_size=1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("credo: config error: rollout.group_size")


def test_estimators_declare_what_they_need():
    """needs (values) and groups come from the registrations; a replay pool makes a group of one sample larger."""
    assert {n for n, e in ADVANTAGE_ESTIMATORS.items() if e.groups} == {
        "grpo", "dr_grpo", "rloo", "opo", "grpo_passk", "reinforce_pp_baseline", "papo",
        "gpg", "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo"}
    assert not ADVANTAGE_ESTIMATORS["reinforce_pp"].groups and not ADVANTAGE_ESTIMATORS["gae"].groups
    load_config(None, ["algo.advantage=reinforce_pp", "rollout.group_size=1"])  # no group baseline: fine
    load_config(None, ["algo.advantage=gae"])  # critic.enabled=null: the critic is switched on
    # G' = group_size + replay.num + replay.negative = 1 + 2 + 0 = 3 >= 2
    load_config(None, ["rollout.group_size=1", "replay.pool=pool.jsonl", "replay.num=2"])
    with pytest.raises(ConfigError, match=r"rollout.group_size: .* >= 2 \(got 1\)"):
        load_config(None, ["algo.advantage=rloo", "rollout.group_size=1"])
    with pytest.raises(ConfigError, match="critic.enabled: algo.advantage=dvpo"):
        load_config(None, ["algo.advantage=dvpo", "critic.head=quantile", "critic.enabled=false"])


def test_writable_probe_leaves_nothing_and_refuses_a_file(tmp_path):
    from credo.recipes.preflight import check_writable

    check_writable("--run-dir", tmp_path / "a" / "b" / "run")
    assert list(tmp_path.iterdir()) == []  # the probe folder was removed; nothing was created
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_writable("--run-dir", tmp_path / "file" / "run")


# ------------------------------------------------------------------------------------ item 16c: preset paths


def test_preset_paths_are_relative_to_the_preset_and_overrides_to_the_cwd(tmp_path, monkeypatch):
    presets = tmp_path / "presets"
    (presets / "data").mkdir(parents=True)
    (presets / "data" / "train.jsonl").write_text("{}\n")
    (presets / "p.yaml").write_text("task: {name: file, train_file: data/train.jsonl, eval_file: /abs/eval.jsonl}\n"
                                    "model: {path: ~/models/m}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(str(presets / "p.yaml"))
    assert cfg.task.train_file == str(presets / "data" / "train.jsonl")
    assert cfg.task.eval_file == "/abs/eval.jsonl" and cfg.model.path == "~/models/m"  # left as written
    assert load_config(str(presets / "p.yaml"), ["task.train_file=rel.jsonl"]).task.train_file == "rel.jsonl"
    # the repository's jsonl preset works from any working directory
    assert Path(load_config("jsonl").task.train_file).is_file()


def test_a_path_that_exists_only_relative_to_the_cwd_is_kept(tmp_path, monkeypatch):
    """A run's config.yaml written from a cwd-relative override (or an older preset) still resumes from there."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("task: {name: file, train_file: data.jsonl}\n")
    (tmp_path / "data.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    assert load_config("run/config.yaml").task.train_file == "data.jsonl"


# ------------------------------------------------------------------------------------ item 16b: vLLM folders


class _FakeLLM:
    """Stands in for vllm.LLM: checks that the model folder is there when the engine starts."""

    fail = False

    def __init__(self, model: str, **kwargs):
        assert (Path(model) / "config.json").is_file()
        if _FakeLLM.fail:
            raise RuntimeError("CUDA out of memory")
        self.model = model

    def init_weight_transfer_engine(self, request):
        # as an engine whose workers cannot join credo_torchdist's group: weight_sync=auto falls back to safetensors
        # at once (a stand-in that accepted the init without joining would leave the trainer waiting 60 s)
        if "master_port" in str(request):
            raise RuntimeError("the stand-in engine joins no process group")


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = _FakeLLM
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr(_FakeLLM, "fail", False)
    return module


def _tmp_folders(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("credo-vllm-*"))


def test_vllm_engine_deletes_its_temporary_model_folder(fake_vllm, tmp_path, monkeypatch):
    import tempfile

    from credo.models import build_model
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model, tok = build_model(TINY, seed=0)
    engine = VLLMRolloutEngine.from_model(model, tok)
    (folder,) = _tmp_folders(tmp_path)
    assert engine.transport.llm.model == str(folder) and (folder / "model.safetensors").is_file()
    engine.close()
    assert not folder.exists()
    engine.close()  # twice: no error
    # dropped without close(): the finalizer removes it
    engine = VLLMRolloutEngine.from_model(model, tok)
    assert len(_tmp_folders(tmp_path)) == 1
    del engine
    gc.collect()
    assert _tmp_folders(tmp_path) == []
    # the engine fails to start: the folder goes at once and the error propagates
    _FakeLLM.fail = True
    with pytest.raises(RuntimeError, match="out of memory"):
        VLLMRolloutEngine.from_model(model, tok)
    assert _tmp_folders(tmp_path) == []


# ------------------------------------------------------------------------------------ item 12: rm serve


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    """A tiny reward model (64 positions) saved as `credo rm train` saves one, its head drawn at random."""
    from credo.models import ValueModel, build_model

    model, tok = build_model(TINY, seed=0)
    rm = ValueModel.from_policy(model)
    with torch.no_grad():
        rm.value_head.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
    path = tmp_path_factory.mktemp("rm") / "reward_model"
    rm.save(path)
    tok.save_pretrained(path)
    return path


class _Server:
    """create_app(...) under uvicorn in a thread of this process, on a free loopback port."""

    def __init__(self, app):
        import uvicorn

        self.app, self.port = app, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "_Server":
        self.thread.start()
        for _ in range(600):
            if self.server.started:
                return self
            time.sleep(0.05)
        raise AssertionError("the reward model server did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


_post = post_json


def _local_score(rm_dir: Path, prompt_ids: list[int], response_ids: list[int]) -> float:
    from credo.models import ValueModel, load_tokenizer
    from credo.models.batch import token_batch
    from credo.methods.reward_models.train import rm_scores

    model, tok = ValueModel.load(rm_dir, "cpu").eval(), load_tokenizer(rm_dir)
    with torch.no_grad():
        return float(rm_scores(model, token_batch([prompt_ids], [response_ids], pad_id=tok.pad_token_id))[0])


def test_cut_left_keeps_the_last_tokens():
    from credo.rewards.rm_server import cut_left

    assert cut_left([1, 2], [3], 5) == ([1, 2], [3])  # 3 tokens <= 5: unchanged
    assert cut_left([1, 2, 3, 4], [5, 6, 7], 5) == ([3, 4], [5, 6, 7])  # 7 > 5: the prompt loses 2 from its left
    assert cut_left([1, 2], [3, 4, 5, 6, 7], 4) == ([2], [5, 6, 7])  # response > 4 - 1: its last 3 + the prompt's last


def test_a_50000_character_prompt_is_cut_to_the_model_context(rm_dir):
    """Default limits: max_tokens = the model's 64 positions. The long pair is scored on its last 64 tokens (its
    index in ``truncated``), the short pair as before."""
    from credo.models import load_tokenizer
    from credo.models.tokenizer import encode_prompt, encode_response
    from credo.rewards.reward_model import create_app

    tok = load_tokenizer(rm_dir)
    long_prompt, response = "abc" * 16_666 + "ab=", "cba"  # 50,001 characters
    with _Server(create_app(rm_dir)) as srv:
        status, body = _post(srv.url + "/score", {"prompts": [long_prompt, "ab="], "responses": [response, "ba"]},
                             timeout=30)
    assert status == 200 and body["truncated"] == [0]
    r_ids = encode_response(tok, response)  # "cba" + EOS: 4 tokens (character tokenizer)
    p_ids = encode_prompt(tok, long_prompt)[-(64 - len(r_ids)):]  # the prompt's last 60 tokens
    assert len(p_ids) + len(r_ids) == 64
    assert body["scores"][0] == pytest.approx(_local_score(rm_dir, p_ids, r_ids), abs=1e-5)
    short = _local_score(rm_dir, encode_prompt(tok, "ab="), encode_response(tok, "ba"))
    assert body["scores"][1] == pytest.approx(short, abs=1e-5)


def test_oversized_requests_get_413_and_bad_bodies_422(rm_dir):
    from credo.rewards.rm_server import ServeLimits, create_app

    limits = ServeLimits(max_request_bytes=2000, max_pairs=3)
    with _Server(create_app(rm_dir, limits=limits)) as srv:
        url = srv.url + "/score"
        assert _post(url, {"prompts": ["x" * 3000], "responses": ["y"]})[0] == 413
        status, body = _post(url, {"prompts": ["a"] * 4, "responses": ["b"] * 4})
        assert status == 413 and "at most 3" in body["detail"]
        assert _post(url, {"prompts": ["a"] * 3, "responses": ["b"] * 3})[0] == 200
        assert _post(url, b"{not json")[0] == 422
        assert _post(url, b"[" * 100_000 + b"]" * 100_000)[0] in (413, 422)  # over 2000 bytes anyway
        assert _post(url, b"[" * 900 + b"]" * 900)[0] == 422  # deep but small: not a mapping
        # a chunked body (no Content-Length) is counted while it is read
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/score", body=iter([b'{"prompts": ["' + b"x" * 1500, b"x" * 1500 + b'"]}']),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        assert conn.getresponse().status == 413
        conn.close()


def test_a_small_request_is_served_between_the_batches_of_a_big_one(rm_dir):
    """batch_size=1: the big request's 6 pairs are 6 forwards. While its first holds the lock, a small request
    arrives and queues; it is scored right after that forward, before the big request's second."""
    from credo.rewards.rm_server import ServeLimits, create_app

    order: list[str] = []
    small_reply: list = []

    def on_batch(prompts: list[str]) -> None:
        order.append(prompts[0])
        if prompts[0] != "big0":
            return
        threading.Thread(target=lambda: small_reply.append(
            _post(srv.url + "/score", {"prompts": ["small"], "responses": ["s"]})), daemon=True).start()
        for _ in range(2000):  # until the small request waits for the lock (bounded)
            if app.state.scorer.lock.queued >= 2:
                return
            time.sleep(0.005)
        raise AssertionError("the small request never queued")

    app = create_app(rm_dir, limits=ServeLimits(batch_size=1), on_batch=on_batch)
    with _Server(app) as srv:
        status, body = _post(srv.url + "/score", {"prompts": [f"big{i}" for i in range(6)], "responses": ["r"] * 6})
        for _ in range(2000):
            if small_reply:
                break
            time.sleep(0.005)
    assert status == 200 and len(body["scores"]) == 6
    assert order == ["big0", "small", "big1", "big2", "big3", "big4", "big5"]
    assert small_reply and small_reply[0][0] == 200 and len(small_reply[0][1]["scores"]) == 1


def test_rm_serve_bearer_token_and_the_client(rm_dir, monkeypatch):
    from credo.rewards.reward_model import create_app, reward_model, score_http
    from credo.types import Example

    monkeypatch.delenv("CREDO_RM_TOKEN", raising=False)
    with _Server(create_app(rm_dir, token="s3cret")) as srv:
        url = srv.url + "/score"
        pair = {"prompts": ["ab="], "responses": ["ba"]}
        assert _post(url, pair)[0] == 401
        assert _post(url, pair, {"Authorization": "Bearer wrong"})[0] == 401
        assert _post(url, pair, {"Authorization": "Bearer s3cret"})[0] == 200
        with pytest.raises(urllib.error.HTTPError) as exc:
            score_http(srv.url, ["ab="], ["ba"])
        assert exc.value.code == 401
        assert len(score_http(srv.url, ["ab="], ["ba"], token="s3cret")) == 1
        monkeypatch.setenv("CREDO_RM_TOKEN", "s3cret")  # the client reads the server's variable too
        assert len(score_http(srv.url, ["ab="], ["ba"])) == 1
        monkeypatch.delenv("CREDO_RM_TOKEN")
        out = reward_model(["ba"], [Example("ab=", "ba")], url=srv.url, token="s3cret")
        assert not out[0].failed
        assert reward_model(["ba"], [Example("ab=", "ba")], url=srv.url)[0].failed  # 401: a failed result


def test_rm_serve_cli_flags_warning_and_bad_values(rm_dir, monkeypatch, capsys):
    import uvicorn

    seen: list = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.append((app, kw)))
    monkeypatch.delenv("CREDO_RM_TOKEN", raising=False)
    assert main(["rm", "serve", str(rm_dir), "--host", "0.0.0.0", "--max-tokens", "32", "--batch-size", "4",
                 "--max-pairs", "10", "--max-request-bytes", "5000"]) == 0
    assert "warning: credo rm serve binds 0.0.0.0 without a token" in capsys.readouterr().err
    scorer = seen[-1][0].state.scorer
    assert (scorer.max_tokens, scorer.limits.batch_size, scorer.limits.max_pairs,
            scorer.limits.max_request_bytes) == (32, 4, 10, 5000)
    monkeypatch.setenv("CREDO_RM_TOKEN", "t")
    assert main(["rm", "serve", str(rm_dir), "--host", "0.0.0.0"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["rm", "serve", str(rm_dir), "--batch-size", "0"]) == 2
    assert capsys.readouterr().err.strip() == "credo: config error: rm serve: batch_size must be >= 1, got 0"
    if not torch.cuda.is_available():
        assert main(["rm", "serve", str(rm_dir), "--device", "cuda"]) == 2
        assert "--device=cuda: CUDA is not available" in capsys.readouterr().err


# ------------------------------------------------------------------ issue 33 item 10: a missing distill teacher

TEACHER_GUIDANCE = ("distill.teacher.path expects a local Hugging Face model directory whose tokenizer is the "
                    "student's: build the demo teacher with `python benchmarks/distill_teacher.py --out "
                    "runs/distill_teacher` (about 20 min), or train one with `credo train --run-dir RUN ...` and set "
                    "distill.teacher.path=RUN/final, or score with a vLLM server: distill.teacher.path=null "
                    "distill.teacher.url=http://HOST:PORT (docs/algorithms/distill.md)")


def test_distill_preset_without_its_teacher_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # configs/distill.yaml's teacher runs/distill_teacher is relative to the cwd: absent
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # ... and, read as a hub id, looked up in the cache alone
    code = main(["train", "--config", "distill", "--run-dir", str(tmp_path / "run")])
    assert code == 1  # a missing input directory: exit 1, as the teacher loader's FileNotFoundError was
    err = capsys.readouterr().err.strip().splitlines()
    # runs/distill_teacher also reads as a hub id (org/name, credo.models.hub): the line says it is not in the hub
    # cache either (and why: offline, or the hub unreachable), then how to get a teacher
    assert len(err) == 1 and err[0].startswith("credo: error: distill.teacher.path: runs/distill_teacher is not a "
                                               "Hugging Face model directory (no config.json)")
    assert err[0].endswith(f"; {TEACHER_GUIDANCE}")
    assert not (tmp_path / "run").exists()  # refused by the preflight, before the run directory exists


def test_resumed_distill_run_whose_teacher_is_gone_says_how_to_get_one(tmp_path, capsys):
    from credo.config import dump_config

    run = tmp_path / "run"
    run.mkdir()
    dump_config(load_config("distill", [f"distill.teacher.path={tmp_path / 'gone'}"]), run / "config.yaml")
    assert main(["train", "--resume", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"credo: error: distill.teacher.path: {tmp_path / 'gone'} is not")
    assert err[0].endswith(TEACHER_GUIDANCE)


def test_teacher_check_takes_adapter_dirs_and_names_a_corrupt_config(tmp_path):
    from credo.recipes.preflight import check_teacher

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")  # a LoRA run's final: the loader loads base + adapter
    check_teacher(load_config("distill", [f"distill.teacher.path={adapter}"]))
    check_teacher(load_config(None))  # no distill section: nothing to check
    check_teacher(load_config("distill", ["distill.teacher.path=null", "distill.teacher.url=http://127.0.0.1:9"]))
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^distill\.teacher\.path: .*config\.json is not a readable JSON file"):
        check_teacher(load_config("distill", [f"distill.teacher.path={corrupt}"]))
