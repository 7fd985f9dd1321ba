"""LoRA on the vLLM engine (credo.rollout.vllm_lora): vLLM serves the base with the trained adapter, and a sync sends
the adapter only. The first tests need no vLLM (file names, ranks); the ``vllm``-marked ones run vLLM for real
(`/tmp/credo-vllm-venv34/bin/python -m pytest -m vllm -n 0 tests/rollout/test_vllm_lora.py`; see
tests/rollout/test_vllm.py): one in-process engine and one server, each shared by its tests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from credo.config import ModelConfig
from credo.config.schema import LoraConfig
from credo.models import build_model, save_model
from credo.models.lora import ADAPTER_WEIGHTS, adapter_state, apply_lora, save_adapter
from credo.rollout.vllm_lora import adapter_tensors, lora_engine_args, vllm_lora_rank
from credo.types import Example, RewardResult, SamplingParams

PROMPTS = [Example("rev abc=", "cba", "a"), Example("rev hgfedc=", "cdefgh", "b"), Example("12+3=", "15", "c"),
           Example("rev qrstu=", "utsrq", "d")]
DEMO = ModelConfig()  # the demo's architecture (vLLM's CPU attention needs head_dim 32, 64, ...)
LORA = LoraConfig(r=4, alpha=8.0)  # every attention and MLP projection (the default targets)
TOL = 1e-5  # float32 on both sides, as tests/rollout/test_vllm.py
FAST = ["train.threads=1", "log.progress=false", "log.tensorboard=false", "log.report=false", "task.train_size=64",
        "task.eval_size=8", "eval.size=8", "eval.k=2", "reward.workers=1", "rollout.group_size=4",
        "train.prompts_per_step=8", "rollout.max_new_tokens=8", "warm_start.steps=80", "checkpoint.every=0"]


def _lora_policy(base_dir: Path):
    """The demo model saved as a base at ``base_dir``, with LORA adapters injected (B = 0: it computes its base)."""
    torch.manual_seed(0)
    model, tok = build_model(DEMO, seed=0)
    save_model(model, tok, base_dir)
    apply_lora(model, LORA, seed=0)
    model.credo_lora_base = str(base_dir.resolve())
    return model, tok


# ----------------------------------------------------------------------------- no vLLM needed

def test_adapter_tensors_are_peft_files_names_and_values(tmp_path):
    model, tok = _lora_policy(tmp_path / "base")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    save_adapter(model, tok, tmp_path / "saved")
    saved = load_file(tmp_path / "saved" / ADAPTER_WEIGHTS)
    for given in (model, adapter_state(model), model.state_dict()):  # a module, its adapters, a whole state
        got = adapter_tensors(given)
        assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    with pytest.raises(ValueError, match="without adapter tensors"):
        adapter_tensors({"model.embed_tokens.weight": torch.zeros(2, 2)})


def test_ranks_map_to_the_ones_vllm_accepts():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 512)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(ValueError, match="up to 512"):
        vllm_lora_rank(513)
    assert lora_engine_args(LORA) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}


# ----------------------------------------------------------------------------- vLLM for real

def _need_vllm():
    from credo.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    assert problem is None, f"the vllm tests need vLLM: {problem}"


def _engine(model, tok, scratch: Path, **kw):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    return VLLMRolloutEngine.from_model(model, tok, seed=0, options=VLLMOptions(dtype="float32", **kw),
                                        scratch=scratch, log_dir=scratch)


@pytest.fixture(scope="module", params=["inprocess", "server"])
def setup(request, tmp_path_factory):
    """(policy, tokenizer, engine, scratch) per mode: a fresh adapter (B = 0), served as version 0."""
    root = tmp_path_factory.mktemp(request.param)
    model, tok = _lora_policy(root / "base")
    engine = _engine(model, tok, root / "scratch", mode=request.param)
    yield model, tok, engine, root / "scratch"
    engine.close()


def _adapter_step(model, tok):
    """One AdamW step of the adapter on the NLL of a few target strings (only lora_ tensors require grad)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    ids = [tok(t)["input_ids"] for t in ("rev abc=cba", "rev hgfedc=cdefgh", "12+3=15", "rev qrstu=utsrq")]
    width = max(map(len, ids))
    x = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    logits = model(input_ids=x, attention_mask=mask).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
    (loss * mask[:, 1:]).sum().div(mask[:, 1:].sum()).backward()
    opt.step()
    opt.zero_grad()


def _gap(model, trajs, tok, temperature: float = 1.0) -> float:
    """max |trainer log-prob - engine log-prob| over the sampled tokens."""
    from credo.models.batch import collate
    from credo.train.forward import batched_logprobs

    batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
    with torch.no_grad():
        lp, _ = batched_logprobs(model, batch, micro_batch_size=None, temperature=temperature)
    return float(((lp.cpu() - batch.rollout_logprobs).abs() * batch.response_mask).max())


@pytest.mark.vllm
def test_served_adapter_logprobs_are_the_trainers_and_only_the_adapter_travels(setup, monkeypatch):
    from credo.guards.weights import probe_mismatch
    from credo.models.lora import adapters_disabled

    model, tok, engine, scratch = setup
    assert engine.served_version() == "0"
    model.eval()
    assert _gap(model, engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8)), tok) < TOL
    _adapter_step(model, tok)
    # a sync must not take the whole-weight path: only the adapter goes, as a PEFT adapter folder
    monkeypatch.setattr(engine.transport, "sync", lambda *a: pytest.fail("whole weights were synced"))
    engine.update_weights(model, version=1)
    assert engine.served_version() == "1" and engine.policy_version == 1
    adapter_bytes = sum(v.numel() * v.element_size() for v in adapter_state(model).values())
    base_bytes = (Path(model.credo_lora_base) / "model.safetensors").stat().st_size
    sent = engine.lora.last_sync["bytes"]
    assert adapter_bytes <= sent < adapter_bytes + 64 * 1024 and sent < base_bytes / 5
    [folder] = [p for p in scratch.glob("credo-vllm-lora-*/*") if p.is_dir()]  # the previous version's is gone
    assert folder.name.endswith("-v1") and json.loads((folder / "adapter_config.json").read_text())["r"] == LORA.r
    for temperature in (1.0, 0.8):
        trajs = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=8, temperature=temperature))
        assert all(t.policy_version == 1 for t in trajs)
        assert _gap(model, trajs, tok, temperature) < TOL  # base + trained adapter, as the trainer computes it
    with adapters_disabled(model):  # the adapter really moved the policy: the base's log-probs are far off
        assert _gap(model, trajs, tok, 0.8) > 1e-3
    assert probe_mismatch(model, engine, 1e-3) is None  # the weight_sync guard's probe (score_ids) agrees
    engine.update_weights(model.state_dict(), version=2)  # a state dict (FSDP2's gathered one) works the same
    assert engine.served_version() == "2"


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.vllm
def test_train_and_resume_with_lora_on_vllm_through_the_cli(tmp_path):
    """2 steps through the CLI, then the run resumed from its step-1 checkpoint (the engine starts on the base the
    checkpoint names, with the checkpoint's adapter)."""
    _need_vllm()
    import shutil

    from credo.cli.main import main

    run = tmp_path / "run"
    assert main(["-q", "train", "--run-dir", str(run), "rollout.engine=vllm", "rollout.vllm.dtype=float32",
                 "model.lora.r=4", "model.lora.alpha=8", "train.lr=3e-3", "train.steps=2", "eval.every=2",
                 *FAST, "checkpoint.every=1"]) == 0
    rows = _rows(run)
    stepped = [r for r in rows if "actor/first_ratio_dev" in r]
    assert len([r for r in rows if "reward/mean" in r]) == 2 and stepped
    assert all(r["actor/first_ratio_dev"] < 1e-4 and r["rollout/logprob_abs_diff"] < TOL for r in stepped)
    assert all(r.get("guard/weight_sync_trips") == 0.0 for r in stepped)
    assert (run / "final" / ADAPTER_WEIGHTS).is_file() and not (run / "final" / "model.safetensors").exists()
    assert not list(run.glob("credo-vllm-lora-*"))  # the adapters' scratch folder went with the engine
    shutil.rmtree(run / "checkpoints" / "step_000002")  # resume from step 1
    assert main(["-q", "train", "--resume", str(run)]) == 0
    again = [r for r in _rows(run) if "reward/mean" in r]
    assert len(again) == 2 and again[1]["rollout/logprob_abs_diff"] < TOL
    first = [r for r in rows if "reward/mean" in r]  # the resumed step samples what the uninterrupted one did
    assert again[1]["reward/mean"] == first[1]["reward/mean"]
    assert again[1].get("guard/weight_sync_trips") == 0.0
