"""LoRA RL with PEFT (credo.models.lora): only adapters train, the reference is the base with adapters off, every
forward path and the lean decoder run through the adapters, checkpoints hold only the adapter, resume is exact,
`credo export` round-trips through plain transformers, and the weight_sync guard catches a stale adapter."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from credo.cli.main import main
from credo.config import ConfigError, load_config
from credo.config.schema import LoraConfig
from credo.train.data_parallel import DataParallel
from credo.distributed.coordinator import RolloutCoordinator
from credo.guards import GuardError, Guards, GuardsConfig
from credo.guards.weights import fingerprint_mismatch, weights_fingerprint
from credo.models import build_model, load_model, save_model
from credo.models.build import merged_adapter_model
from credo.models.lora import BASE_FILE, adapters_disabled, apply_lora
from credo.recipes.lora_stage import check_lora_config
from credo.rollout import HFRolloutEngine
from credo.tracking.metrics import read_metrics
from credo.train.forward import NAIVE, ForwardOptions, policy_logprobs
from credo.train.optim import build_optimizer
from credo.types import Example, SamplingParams
from tests.conftest import TINY, TINY_RUN
from tests.train.test_forward import _group_batch

LORA = LoraConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
RUN = [*TINY_RUN, "model.lora.r=4", "model.lora.alpha=8", "train.lr=3e-3", "log.progress=false", "log.report=false",
       "reward.name=tests.reward_fixtures:length_score", "reward.executor=inline", "algo.kl_coef=0.05"]


def _lora_model(seed: int = 0, *, kick: float = 0.0):
    """The tiny policy with LORA adapters; ``kick`` > 0 sets every lora_B to seeded normal noise of that scale (as
    if training had moved it: B starts at zero, so a fresh adapter computes exactly the base)."""
    model, tok = build_model(TINY, seed=0)
    base = copy.deepcopy(model)
    apply_lora(model, LORA, seed=seed)
    if kick:
        _kick(model, kick, seed)
    return model, base, tok


@torch.no_grad()
def _kick(model, scale: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 100)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.copy_(scale * torch.randn(p.shape, generator=g))


def test_only_adapter_weights_train_and_the_optimizer_holds_exactly_them():
    model, _, _ = _lora_model()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # TINY: hidden 32, 4 heads of 8, 2 kv heads (k/v out 16), MLP 64, 2 layers; r = 4. Per layer:
    # q_proj A 4x32 + B 32x4 = 256, v_proj A 4x32 + B 16x4 = 192, down_proj A 4x64 + B 32x4 = 384 -> 832; x 2 = 1664
    assert sum(p.numel() for p in trainable.values()) == 1664
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999))
    held = {id(p) for group in opt.param_groups for p in group["params"]}
    assert held == {id(p) for p in trainable.values()}


def test_reference_is_the_base_with_adapters_off_on_every_forward_path():
    model, base, tok = _lora_model(kick=0.5)
    batch = _group_batch(tok)
    base_lp, _ = policy_logprobs(base, batch, opts=NAIVE)
    policy_lp, _ = policy_logprobs(model, batch, opts=NAIVE)
    assert (policy_lp - base_lp).abs().max() > 1e-2  # the kicked adapter changes the policy
    for opts in (ForwardOptions(chunk_size=4), ForwardOptions(chunk_size=0, pack=True),
                 ForwardOptions(chunk_size=3, share_prompt=True)):  # chunked, packed, shared-prompt: via the adapters
        lp, _ = policy_logprobs(model, batch, opts=opts)
        torch.testing.assert_close(lp, policy_lp, rtol=0, atol=1e-5)
        with adapters_disabled(model):
            ref, _ = policy_logprobs(model, batch, opts=opts)
        torch.testing.assert_close(ref, base_lp, rtol=0, atol=1e-5)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)  # restored on exit
    torch.testing.assert_close(policy_logprobs(model, batch, opts=NAIVE)[0], policy_lp, rtol=0, atol=0)


def test_lean_decoder_samples_with_the_synced_adapter():
    trainer, base, tok = _lora_model()
    engine = HFRolloutEngine(copy.deepcopy(trainer), tok, seed=3, lean=True)  # a copy, as one-step-off mode has
    assert engine.lean is not None
    _kick(trainer, 0.5)  # "an update"
    engine.update_weights(trainer, version=1)
    prompts = [Example("abc", "cba", "0"), Example("hello", "olleh", "1")]
    trajs = engine.generate(prompts, 3, SamplingParams(temperature=1.0, max_new_tokens=8))
    from credo.models.batch import collate
    from credo.types import RewardResult

    batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
    mask = batch.response_mask.bool()
    trained, _ = policy_logprobs(trainer, batch, opts=NAIVE)
    torch.testing.assert_close(batch.rollout_logprobs[mask], trained[mask], rtol=0, atol=1e-5)
    stale, _ = policy_logprobs(base, batch, opts=NAIVE)
    assert (batch.rollout_logprobs[mask] - stale[mask]).abs().max() > 1e-2  # the base alone would not match


def _coordinator(trainer, engine, mode: str = "error") -> RolloutCoordinator:
    coord = RolloutCoordinator(DataParallel())
    coord.attach(model=trainer, engine=engine, runner=None, collector=None, guards=Guards(GuardsConfig(weight_sync=mode)))
    return coord


def test_a_sync_that_drops_the_adapter_trips_the_weight_sync_guard(monkeypatch):
    trainer, _, tok = _lora_model()
    engine = HFRolloutEngine(copy.deepcopy(trainer), tok, lean=True)
    coord = _coordinator(trainer, engine)
    coord.sync(0)  # a real sync: fingerprints agree
    assert coord.guards.checks["weight_sync"] == 1 and coord.guards.trips["weight_sync"] == 0
    _kick(trainer, 0.1)
    real = engine.update_weights
    monkeypatch.setattr(engine, "update_weights", lambda w, *, version: setattr(engine, "policy_version", version))
    with pytest.raises(GuardError) as err:
        coord.sync(1)
    msg = str(err.value)
    assert "\n" not in msg and "guard weight_sync" in msg and "lora_B" in msg and "policy 1" in msg
    monkeypatch.setattr(engine, "update_weights", real)
    coord.sync(1)  # the adapter travels: passes
    assert coord.guards.trips["weight_sync"] == 1 and coord.guards.checks["weight_sync"] == 3


def test_weight_sync_guard_in_warn_mode_counts_and_the_fingerprint_is_a_displacement_check():
    trainer, _, tok = _lora_model()
    engine = HFRolloutEngine(copy.deepcopy(trainer), tok)
    coord = _coordinator(trainer, engine, mode="warn")
    _kick(trainer, 0.1)
    engine.update_weights = lambda w, *, version: None  # stale
    coord.sync(1)
    assert coord.guards.metrics()["guard/weight_sync_trips"] == 1.0
    # p = sum r_i x_i, s = sum |r_i||x_i|: a zero tensor has (0, 0); scaling x by 2 doubles both
    fp = weights_fingerprint({"w": torch.zeros(3), "v": torch.tensor([1.0, -2.0, 0.5])})
    assert fp["w"] == (0.0, 0.0)
    p, s = fp["v"]
    p2, s2 = weights_fingerprint({"v": torch.tensor([2.0, -4.0, 1.0])})["v"]
    assert p2 == pytest.approx(2 * p, rel=1e-12) and s2 == pytest.approx(2 * s, rel=1e-12) and abs(p) <= s
    assert fingerprint_mismatch(fp, fp, 1e-5) is None
    assert "no tensor w" in fingerprint_mismatch(fp, {"v": fp["v"]}, 1e-5)
    # a change of 1e-3 in one of three elements moves p by |r_i| 1e-3, far more than 1e-5 s (s ~ 3.5 |r|)
    moved = weights_fingerprint({"v": torch.tensor([1.0, -2.001, 0.5])})["v"]
    assert fingerprint_mismatch({"v": (p, s)}, {"v": moved}, 1e-5) is not None


def test_export_merges_the_adapter_and_plain_transformers_give_the_same_greedy_outputs(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    model, base, tok = _lora_model(kick=0.5)
    save_model(base, tok, tmp_path / "base")
    model.credo_lora_base = str(tmp_path / "base")
    save_model(model, tok, tmp_path / "adapter")
    files = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors", BASE_FILE, "tokenizer.json",
                     "tokenizer_config.json"]
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert len(saved) == 12 and all(k.startswith("base_model.model.") and "lora_" in k for k in saved)  # 2x3x(A,B)
    loaded, _ = load_model(tmp_path / "adapter")
    merged, _ = merged_adapter_model(tmp_path / "adapter")
    save_model(merged, tok, tmp_path / "plain")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain", local_files_only=True)
    assert not any("lora" in k for k in plain.state_dict())
    ids = torch.tensor([tok.encode("abcab")])
    outs = {}
    for name, m in (("adapter", model), ("loaded", loaded), ("plain", plain), ("base", base)):
        outs[name] = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                                pad_token_id=tok.pad_token_id)[0].tolist()
    assert outs["adapter"] == outs["loaded"] == outs["plain"]
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
        assert (plain(ids).logits - base(ids).logits).abs().max() > 1e-2  # the merged delta is really there


def test_unsupported_combinations_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="lm_head"):
        check_lora_config(load_config(None, ["model.lora.target_modules=[q_proj, lm_head]"]))
    check_lora_config(load_config(None, ["model.lora.r=8", "rollout.engine=vllm"]))  # credo.rollout.vllm_lora
    with pytest.raises(NotImplementedError, match="distributed.backend=ray"):
        check_lora_config(load_config(None, ["model.lora.r=8", "distributed.backend=ray"]))
    check_lora_config(load_config(None, ["model.lora.r=8", "algo.advantage=gae"]))  # tests/models/test_lora_critic.py
    check_lora_config(load_config("lora_grpo", []))  # the preset is accepted


def test_cli_lora_run_saves_only_the_adapter_and_exports(tmp_path: Path):
    run = tmp_path / "run"
    assert main(["-q", "train", "--run-dir", str(run), *RUN, "train.steps=2", "checkpoint.every=1"]) == 0
    assert not (run / "reference").exists() and (run / "base" / "model.safetensors").is_file()
    model_dir = run / "checkpoints" / "step_000002" / "model"
    assert not (model_dir / "model.safetensors").exists() and (model_dir / "adapter_model.safetensors").is_file()
    assert json.loads((model_dir / BASE_FILE).read_text())["relative"] == "../../../base"
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[1]["actor/kl"] == 0.0  # step 0: B = 0, the policy is its base
    assert rows[2]["actor/kl"] > 0.0  # step 1: the adapter moved away from the reference (the base)
    assert rows[2]["guard/weight_sync_trips"] == 0.0
    before = load_file(run / "checkpoints" / "step_000001" / "model" / "adapter_model.safetensors")
    after = load_file(model_dir / "adapter_model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in after)
    out = tmp_path / "export"
    assert main(["-q", "export", str(run), "--checkpoint", "step_000002", "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert main(["-q", "export", str(run), "--checkpoint", "step_9", "--out", str(tmp_path / "x")]) == 1


def test_cli_one_step_off_run_with_an_engine_that_drops_the_adapter_stops_on_the_guard(tmp_path: Path, monkeypatch,
                                                                                      capsys):
    """One-step-off mode samples from a copy of the policy: a sync that never reaches it is caught at step 1."""
    def drop_adapter(self, weights, *, version):
        self.policy_version = version  # the version moves, the weights do not

    monkeypatch.setattr(HFRolloutEngine, "update_weights", drop_adapter)
    code = main(["-q", "train", "--run-dir", str(tmp_path / "run"), *RUN, "train.steps=3", "rollout.one_step_off=true"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and err.startswith("credo: guard error: guard weight_sync: after the sync to policy 1"), err
    assert "lora_B" in err and "guards.weight_sync=warn" in err


def test_a_fresh_zero_initialised_adapter_starts_from_the_bases_logprobs():
    """issue 37's cross-mode equivalence: apply_lora's B = 0, so the adapted policy's log-probs equal the base's
    bit for bit on every forward path (it catches a non-zero B init, a scale or dropout applied at inference, an
    adapter on the wrong module changing the base weights, or a forward path that skips the adapter's merge)."""
    model, base, tok = _lora_model(seed=5)
    assert all(torch.count_nonzero(p) == 0 for n, p in model.named_parameters() if "lora_B" in n)
    assert any(torch.count_nonzero(p) > 0 for n, p in model.named_parameters() if "lora_A" in n)  # A is live
    batch = _group_batch(tok)
    base_lp, _ = policy_logprobs(base, batch, opts=NAIVE)
    for opts in (NAIVE, ForwardOptions(chunk_size=4), ForwardOptions(chunk_size=0, pack=True),
                 ForwardOptions(chunk_size=3, share_prompt=True)):
        lp, _ = policy_logprobs(model, batch, opts=opts)
        ref, _ = policy_logprobs(base, batch, opts=opts)
        assert torch.equal(lp, ref), opts
        torch.testing.assert_close(lp, base_lp, rtol=0, atol=1e-5)  # and the paths agree with the naive one
    _kick(model, 0.5)  # the check can fail: a moved B changes the log-probs
    assert not torch.equal(policy_logprobs(model, batch, opts=NAIVE)[0], base_lp)
