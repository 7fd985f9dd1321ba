"""Critic losses (clipped_mse, dvpo, vrpo) by hand, critic heads (scalar, quantile, vib), their save / load, exact
gradient accumulation of the critic update, config validation, and tiny CLI runs with a DVPO and a VRPO critic."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from credo.algo import AggNorm, agg_loss, masked_mean, value_loss
from credo.algo.critic import compute_critic_loss, critic_loss_requirements, frozen_lm_signal, list_critic_losses
from credo.algo.dvpo import dvpo_critic_terms
from credo.cli.main import main
from credo.config import ConfigError, load_config
from credo.models.value import HEAD_CONFIG, QuantileHead, ValueModel, VIBHead
from credo.models.batch import collate
from credo.tracking.metrics import read_metrics
from credo.types import Example, RewardResult, Trajectory
from tests.conftest import TINY_RUN

close = torch.testing.assert_close

# two response tokens, one row: V = [1.0, 0.2], V_old = [0, 0], Ret = [0.8, 1.0], cliprange_value k = 0.5
V = torch.tensor([[1.0, 0.2]])
V_OLD = torch.zeros(1, 2)
RET = torch.tensor([[0.8, 1.0]])
MASK = torch.ones(1, 2)
# token 0: plain (1.0 - 0.8)^2 = 0.04; clip(1.0, -0.5, 0.5) = 0.5 -> (0.5 - 0.8)^2 = 0.09; 1/2 max = 0.045 (clipped)
# token 1: plain (0.2 - 1.0)^2 = 0.64; 0.2 is inside the clip range -> 0.64 too; 1/2 max = 0.32 (not clipped: equal)
MSE = torch.tensor([[0.045, 0.32]])


def _inputs(**extra):
    return {"values": V, "old_values": V_OLD, "returns": RET, **extra}


# ------------------------------------------------------------------------------------------------ losses

def test_clipped_mse_by_hand_and_equal_to_the_old_value_loss():
    assert list_critic_losses() == ["clipped_mse", "dfpo", "dvpo", "vrpo"]
    out = compute_critic_loss("clipped_mse", response_mask=MASK, inputs=_inputs(), cliprange_value=0.5)
    assert out.loss.item() == pytest.approx((0.045 + 0.32) / 2)  # token-mean 0.1825
    assert out.metrics["vf_clipfrac"] == pytest.approx(0.5)  # token 0 only
    assert out.metrics["vpred_mean"] == pytest.approx(0.6)
    old = value_loss(V, V_OLD, RET, MASK, cliprange_value=0.5)
    assert out.loss.item() == pytest.approx(old.loss.item()) and out.metrics == pytest.approx(old.metrics)
    # random inputs, a ragged mask, every aggregation, with mini-batch normalisers: still the old value_loss
    g = torch.Generator().manual_seed(0)
    v, v_old, ret = (torch.randn(4, 5, generator=g) for _ in range(3))
    mask = (torch.rand(4, 5, generator=g) > 0.3).float()
    norm = AggNorm.of(torch.cat([mask, torch.ones(2, 5)]), 7.0)  # as if this call were part of a mini-batch
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        new = compute_critic_loss("clipped_mse", response_mask=mask, agg=agg, norm=norm,
                                  inputs={"values": v, "old_values": v_old, "returns": ret}, cliprange_value=0.2)
        ref = value_loss(v, v_old, ret, mask, cliprange_value=0.2, agg=agg, norm=norm)
        close(new.loss, ref.loss)
        assert new.metrics == pytest.approx(ref.metrics)


def test_vrpo_weight_mode_by_hand():
    kl = torch.tensor([[2.0, 4.0]])
    ent = torch.tensor([[1.0, 3.0]])
    # x = entropy / mean over the response: mean 2 -> [0.5, 1.5]; aux_coef c = 0.5: w = 1 - c + c x = [0.75, 1.25]
    close(frozen_lm_signal(ent, MASK), torch.tensor([[0.5, 1.5]]))
    # per token: w * MSE + vib_beta * KL = [0.75 * 0.045 + 0.1 * 2, 1.25 * 0.32 + 0.1 * 4] = [0.23375, 0.8]
    out = compute_critic_loss("vrpo", response_mask=MASK, inputs=_inputs(kl=kl, aux=torch.zeros(1, 2), ref_entropy=ent),
                              vib_beta=0.1, aux_mode="weight", aux_coef=0.5)
    assert out.loss.item() == pytest.approx((0.23375 + 0.8) / 2)
    assert out.metrics["vrpo_weight_dev"] == pytest.approx(0.25)  # mean |w - 1| = (0.25 + 0.25) / 2
    assert out.metrics["vib_kl"] == pytest.approx(3.0) and out.metrics["vf_clipfrac"] == pytest.approx(0.5)
    # the surprisal reading: -log p = [1, 3] is the same statistic here -> the same loss
    same = compute_critic_loss("vrpo", response_mask=MASK,
                               inputs=_inputs(kl=kl, aux=torch.zeros(1, 2), ref_logprobs=-ent),
                               vib_beta=0.1, aux_mode="weight", aux_source="surprisal", aux_coef=0.5)
    assert same.loss.item() == pytest.approx(out.loss.item())
    # weight_max caps x: entropies [1, 9] -> mean 5 -> x = [0.2, 1.8] -> min(x, 1.5) = [0.2, 1.5];
    # w = [0.5 + 0.1, 0.5 + 0.75] = [0.6, 1.25]; loss = [0.6 * 0.045, 1.25 * 0.32] = [0.027, 0.4] (vib_beta 0)
    capped = compute_critic_loss("vrpo", response_mask=MASK,
                                 inputs=_inputs(kl=kl, aux=torch.zeros(1, 2), ref_entropy=torch.tensor([[1.0, 9.0]])),
                                 vib_beta=0.0, aux_coef=0.5, weight_max=1.5)
    assert capped.loss.item() == pytest.approx((0.027 + 0.4) / 2)


def test_vrpo_target_and_none_modes_by_hand():
    kl = torch.tensor([[2.0, 4.0]])
    ent = torch.tensor([[1.0, 3.0]])  # x = [0.5, 1.5]
    aux = torch.tensor([[0.4, 1.0]], requires_grad=True)
    # target: MSE + c (aux - x)^2 + beta KL; (aux - x)^2 = [0.01, 0.25]; c = 0.5 -> [0.005, 0.125]
    # per token [0.045 + 0.005 + 0.2, 0.32 + 0.125 + 0.4] = [0.25, 0.845]
    out = compute_critic_loss("vrpo", response_mask=MASK, inputs=_inputs(kl=kl, aux=aux, ref_entropy=ent),
                              vib_beta=0.1, aux_mode="target", aux_coef=0.5)
    assert out.loss.item() == pytest.approx((0.25 + 0.845) / 2)
    assert out.metrics["vrpo_aux_loss"] == pytest.approx((0.01 + 0.25) / 2)
    (grad,) = torch.autograd.grad(out.loss, aux)  # d/daux (1/2) sum c (aux - x)^2 = c (aux - x) = 0.5 * [-0.1, -0.5]
    close(grad, torch.tensor([[-0.05, -0.25]]))
    # none: the clipped regression + beta KL = clipped_mse + 0.1 * mean KL = 0.1825 + 0.3; no frozen-LM input needed
    none = compute_critic_loss("vrpo", response_mask=MASK, inputs=_inputs(kl=kl), vib_beta=0.1, aux_mode="none")
    mse = compute_critic_loss("clipped_mse", response_mask=MASK, inputs=_inputs())
    assert none.loss.item() == pytest.approx(mse.loss.item() + 0.1 * 3.0) == pytest.approx(0.4825)
    assert "vrpo_weight_dev" not in none.metrics and "vrpo_aux_loss" not in none.metrics


def test_critic_loss_requirements_and_missing_inputs():
    assert critic_loss_requirements("clipped_mse") == ()
    assert critic_loss_requirements("dvpo") == ("quantiles", "return_quantiles")
    assert critic_loss_requirements("vrpo", {"aux_mode": "none"}) == ("kl",)
    assert critic_loss_requirements("vrpo") == ("kl", "ref_entropy")  # defaults: weight mode (no aux head), entropy
    assert critic_loss_requirements("vrpo", {"aux_mode": "target", "aux_source": "surprisal"}) == \
        ("kl", "aux", "ref_logprobs")
    with pytest.raises(ValueError, match="needs kl, ref_entropy"):
        compute_critic_loss("vrpo", response_mask=MASK, inputs=_inputs())
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        compute_critic_loss("vrpo", response_mask=MASK, inputs=_inputs(kl=V, aux=V, ref_entropy=V),
                            aux_source="surprisal")
    with pytest.raises(ValueError, match="needs return_quantiles"):
        compute_critic_loss("dvpo", response_mask=MASK, inputs=_inputs(quantiles=torch.zeros(1, 2, 2, 30)))
    with pytest.raises(ValueError, match="aux_mode must be"):
        compute_critic_loss("vrpo", response_mask=MASK, inputs=_inputs(kl=V, aux=V, ref_entropy=V), aux_mode="bogus")
    with pytest.raises(TypeError, match="did you mean 'vib_beta'"):
        compute_critic_loss("vrpo", response_mask=MASK, inputs=_inputs(kl=V), aux_mode="none", vib_beat=0.1)
    with pytest.raises(KeyError, match="unknown critic loss"):
        critic_loss_requirements("dvp")


def test_dvpo_critic_loss_is_the_aggregated_sum_of_its_terms():
    g = torch.Generator().manual_seed(3)
    b, t, n, m = 2, 3, 2, 30
    quantiles = torch.randn(b, t, n, m, generator=g).sort(-1).values.requires_grad_(True)
    targets = torch.randn(b, t, m, generator=g).sort(-1).values
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    values = quantiles.detach().mean((-1, -2))
    inputs = {"values": values, "quantiles": quantiles, "return_quantiles": targets}
    out = compute_critic_loss("dvpo", response_mask=mask, agg="seq-mean-token-mean", inputs=inputs)
    terms = dvpo_critic_terms(quantiles, targets)  # all 7, weight 1
    assert set(terms) == {"qr", "cvar", "upper", "mean_shift", "tail_shape", "curvature", "consistency"}
    close(out.loss, agg_loss(sum(terms.values()), mask, "seq-mean-token-mean"))
    for name, term in terms.items():
        assert out.metrics[f"dvpo_{name}"] == pytest.approx(float(masked_mean(term.detach(), mask)), rel=1e-5)
    (grad,) = torch.autograd.grad(out.loss, quantiles)
    assert grad[1, 1:].abs().sum() == 0 and grad[0].abs().sum() > 0  # masked tokens get no gradient
    # a coefficient scales its term; 0 drops it (its guard too: one head has no consistency term to compute)
    half = compute_critic_loss("dvpo", response_mask=mask, inputs=inputs, cvar_coef=0.5, consistency_coef=0.0)
    want = sum(v for k, v in terms.items() if k not in ("cvar", "consistency")) + 0.5 * terms["cvar"]
    close(half.loss, agg_loss(want, mask, "token-mean"))
    assert "dvpo_consistency" not in half.metrics
    one_head = {**inputs, "quantiles": quantiles[:, :, :1]}
    with pytest.raises(ValueError, match="consistency needs >= 2 heads"):
        compute_critic_loss("dvpo", response_mask=mask, inputs=one_head)
    compute_critic_loss("dvpo", response_mask=mask, inputs=one_head, consistency_coef=0.0)


# ------------------------------------------------------------------------------------------------- heads

def test_quantile_head_shapes_and_value_is_the_mean():
    torch.manual_seed(0)
    head = QuantileHead(8, heads=3, quantiles=5)
    out = head(torch.randn(2, 4, 8))
    assert out.quantiles.shape == (2, 4, 3, 5) and out.values.shape == (2, 4)
    close(out.values, out.quantiles.mean((-1, -2)))
    assert out.kl is None and out.aux is None
    assert not torch.equal(out.quantiles[..., 0, :], out.quantiles[..., 1, :])  # the heads start apart
    with pytest.raises(ValueError, match="heads >= 1"):
        QuantileHead(8, heads=0)


def test_vib_head_kl_by_hand_eval_deterministic_train_stochastic():
    head = VIBHead(4, z_dim=2)
    with torch.no_grad():  # encoder output = its bias: mu = [1, -2], log sigma^2 = [0, log 4]
        head.encoder.weight.zero_()
        head.encoder.bias.copy_(torch.tensor([1.0, -2.0, 0.0, math.log(4.0)]))
        head.value.weight.copy_(torch.tensor([[1.0, 1.0]]))  # V = z_1 + z_2
        head.aux.weight.copy_(torch.tensor([[2.0, 0.0]]))  # aux = 2 z_1
    h = torch.randn(2, 3, 4)
    # KL = 1/2 sum(mu^2 + sigma^2 - 1 - log sigma^2) = 1/2 [(1 + 1 - 1 - 0) + (4 + 4 - 1 - log 4)] = 4 - log 2
    want_kl = 0.5 * ((1 + 1 - 1 - 0) + (4 + 4 - 1 - math.log(4.0)))
    assert want_kl == pytest.approx(4.0 - math.log(2.0))
    head.eval()
    a, b = head(h), head(h)
    close(a.kl, torch.full((2, 3), want_kl))
    close(a.values, torch.full((2, 3), -1.0))  # z = mu: 1 + (-2)
    close(a.aux, torch.full((2, 3), 2.0))
    assert torch.equal(a.values, b.values)
    head.train()
    torch.manual_seed(0)
    c, d = head(h), head(h)
    close(c.kl, a.kl)  # the KL is of q(z|h), not of the draw
    assert not torch.equal(c.values, d.values) and not torch.equal(c.values, a.values)
    # z = mu + sigma eps, sigma = [1, 2]: V + 1 = eps_1 + 2 eps_2 and aux - 2 = 2 eps_1, so eps_2 = (V + 1 - (aux - 2) / 2) / 2
    eps1, eps2 = (c.aux - 2.0) / 2.0, (c.values + 1.0 - (c.aux - 2.0) / 2.0) / 2.0
    assert 0.2 < float(torch.cat([eps1.flatten(), eps2.flatten()]).detach().std()) < 3.0  # unit-scale noise


@pytest.mark.parametrize("kind,args", [("scalar", {}), ("quantile", {"heads": 2, "quantiles": 7}),
                                       ("vib", {"z_dim": 3})])
def test_value_model_save_load_round_trip(tmp_path, tiny_model, kind, args):
    model, _ = tiny_model
    critic = ValueModel.from_policy(model, kind, **args)
    torch.manual_seed(1)
    with torch.no_grad():  # zero-initialised outputs would make the round trip vacuous
        for p in critic.value_head.parameters():
            p.normal_(0.0, 0.5)
    critic.save(tmp_path / "c")
    assert json.loads((tmp_path / "c" / HEAD_CONFIG).read_text()) == {"kind": kind, "args": args}
    loaded = ValueModel.load(tmp_path / "c")
    assert loaded.head_kind == kind and loaded.head_args == args
    ids = torch.randint(4, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    feed = {"input_ids": ids, "attention_mask": torch.ones(2, 6, dtype=torch.long),
            "position_ids": torch.arange(6).expand(2, 6)}
    critic.eval(), loaded.eval()
    with torch.no_grad():
        a, b = critic.outputs(**feed), loaded.outputs(**feed)
    assert a.values.abs().sum() > 0
    for field in ("values", "quantiles", "kl", "aux"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), field
        assert x is None or torch.equal(x, y), field
    assert (a.quantiles is not None) == (kind == "quantile") and (a.kl is not None) == (kind == "vib")


def test_a_critic_saved_without_value_head_json_loads_as_scalar(tmp_path, tiny_model):
    model, _ = tiny_model
    critic = ValueModel.from_policy(model)
    with torch.no_grad():
        critic.value_head.weight.normal_(0.0, 1.0)
    critic.save(tmp_path / "old")
    (tmp_path / "old" / HEAD_CONFIG).unlink()  # what the scalar-only ValueModel wrote
    loaded = ValueModel.load(tmp_path / "old")
    assert loaded.head_kind == "scalar" and isinstance(loaded.value_head, torch.nn.Linear)
    ids = torch.randint(4, 20, (1, 5), generator=torch.Generator().manual_seed(0))
    feed = (ids, torch.ones(1, 5, dtype=torch.long), torch.arange(5).unsqueeze(0))
    with torch.no_grad():
        assert torch.equal(loaded(*feed), critic(*feed))


# --------------------------------------------------------------------------- critic update, micro-batching

def _critic_batch(tok, m: int):
    """6 rows: prompts and responses of different lengths (padding both sides), one masked middle span; old values,
    returns and sorted quantile targets (B, T, M) drawn at random, zero outside the loss mask."""
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i, (p, r) in enumerate([(3, 9), (7, 2), (1, 5), (5, 12), (4, 1), (6, 7)]):
        resp = torch.randint(4, len(tok), (r,), generator=g).tolist()
        mask = [1] * 4 + [0] * 5 + [1] * 3 if i == 3 else [1] * r
        trajs.append(Trajectory(example=Example(str(i), "", str(i)), group_id=i // 2,
                                prompt_ids=torch.randint(4, len(tok), (p,), generator=g).tolist(), response_ids=resp,
                                rollout_logprobs=[0.0] * r, response_mask=mask, finish_reason="eos"))
    batch = collate(trajs, [RewardResult(float(i % 2)) for i in range(len(trajs))], pad_id=tok.pad_token_id)
    mask = batch.response_mask
    batch.values = 0.3 * torch.randn(mask.shape, generator=g) * mask
    batch.returns = torch.randn(mask.shape, generator=g) * mask
    targets = torch.randn((*mask.shape, m), generator=g).sort(-1).values * mask.unsqueeze(-1)  # (B, T, M)
    batch.set_extra("return_quantiles", targets)
    return batch


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_dvpo_critic_update_is_exact_under_gradient_accumulation(tiny_model, agg):
    """update_critic with critic.loss=dvpo: one micro-batch of 6 rows vs micro-batches of 2 (with SGD at lr 1 the
    parameter change is minus the gradient) give the same gradients and the same logged terms."""
    from credo.train.optim import build_scheduler
    from credo.train.update import UpdateOptions, update_critic

    model, tok = tiny_model
    base = ValueModel.from_policy(model, "quantile", heads=2, quantiles=30)
    batch = _critic_batch(tok, 30)
    results = []
    for micro in ("null", "2"):
        cfg = load_config(None, ["algo.advantage=dvpo", "critic.head=quantile",
                                 "critic.head_args={heads: 2, quantiles: 30}", "critic.loss=dvpo", f"algo.agg={agg}",
                                 "critic.grad_clip=0", "train.warmup_steps=0", f"train.micro_batch_size={micro}"])
        critic = copy.deepcopy(base)
        opt = torch.optim.SGD(critic.parameters(), lr=1.0)
        metrics = update_critic(UpdateOptions.of(cfg), critic, batch, opt,
                                build_scheduler(opt, warmup_steps=0, total_steps=1), step=0)
        results.append(([(p0 - p).detach() for p0, p in zip(base.parameters(), critic.parameters())], metrics))
    (g_whole, m_whole), (g_micro, m_micro) = results
    assert sum(float(g.abs().sum()) for g in g_whole) > 0
    for a, b in zip(g_whole, g_micro):
        close(b, a, atol=1e-6, rtol=1e-4)
    assert {k for k in m_whole if k.startswith("critic/dvpo_")} == {
        f"critic/dvpo_{k}" for k in ("qr", "cvar", "upper", "mean_shift", "tail_shape", "curvature", "consistency")}
    for key in m_whole:
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-6), key
    # critic.loss_args reach the loss: a zero coefficient drops the term from the update's metrics
    cfg = load_config(None, ["algo.advantage=dvpo", "critic.head=quantile", "critic.loss=dvpo",
                             "critic.head_args={heads: 2, quantiles: 30}", "critic.loss_args={consistency_coef: 0}"])
    critic = copy.deepcopy(base)
    opt = torch.optim.SGD(critic.parameters(), lr=1.0)
    metrics = update_critic(UpdateOptions.of(cfg), critic, batch, opt,
                            build_scheduler(opt, warmup_steps=0, total_steps=1), step=0)
    assert "critic/dvpo_consistency" not in metrics and "critic/dvpo_qr" in metrics


# ------------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("overrides,match", [
    (["critic.loss=dvpo", "algo.advantage=dvpo"], "needs critic.head=quantile"),
    (["algo.advantage=dvpo"], "needs critic.head=quantile"),
    (["critic.loss=dvpo", "critic.head=quantile", "algo.advantage=gae"], "needs algo.advantage=dvpo"),
    (["critic.loss=vrpo", "algo.advantage=gae"], "needs critic.head=vib"),
    (["critic.head=quantile", "critic.head_args={heads: 0}"], "critic.head_args: quantile head needs heads >= 1"),
    (["critic.head=quantile", "critic.head_args={z_dim: 4}"], "critic.head_args: .*z_dim"),
    (["critic.head=vib", "critic.loss=vrpo", "critic.loss_args={vib_beat: 0.1}"], "did you mean 'vib_beta'"),
    (["critic.head=vib", "critic.loss=vrpo", "critic.loss_args={aux_coef: high}"], "aux_coef' expects float"),
    (["critic.head=bogus"], "critic.head"),
])
def test_critic_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def test_critic_configs_that_fit_together_load():
    cfg = load_config(None, ["algo.advantage=dvpo", "critic.head=quantile", "critic.loss=dvpo",
                             "critic.head_args={heads: 2, quantiles: 30}", "critic.loss_args={cvar_coef: 0.5}"])
    assert cfg.critic.head_args == {"heads": 2, "quantiles": 30} and cfg.critic.loss_args == {"cvar_coef": 0.5}
    load_config(None, ["algo.advantage=gae", "critic.head=vib", "critic.loss=vrpo", "critic.head_args={z_dim: 4}",
                       "critic.loss_args={aux_mode: target, aux_source: surprisal}"])
    load_config(None, ["algo.advantage=dvpo", "critic.head=quantile"])  # DVPO advantages, clipped_mse critic


# ----------------------------------------------------------------------------------------------- CLI runs

RUN = [*TINY_RUN, "train.steps=2", "eval.every=0", "log.report=false", "log.tensorboard=false", "log.progress=false"]


def test_vrpo_run_logs_the_bottleneck_kl_and_keeps_a_reference(tmp_path: Path):
    run = tmp_path / "vrpo"
    assert main(["-q", "train", "--run-dir", str(run), *RUN, "critic.head=vib", "critic.loss=vrpo",
                 "algo.advantage=gae", "reward.name=tests.reward_fixtures:length_score", "reward.executor=inline"]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["critic/vib_kl"] > 0 and "critic/vrpo_weight_dev" in r  # default: entropy-weighted regression
    assert (run / "reference" / "model.safetensors").is_file()  # VRPO's frozen LM, even with algo.kl_coef = 0
    spec = json.loads((run / "checkpoints" / "step_000002" / "critic" / HEAD_CONFIG).read_text())
    assert spec["kind"] == "vib"


def test_method_packages_critic_losses_and_heads_are_listed_without_importing_them_first():
    """CRITIC_LOSSES and CRITIC_HEADS name DVPO's and DFPO's modules as built-ins (credo.registry.Registry): the
    first listing imports them, so credo.algo and credo.models never import a method package themselves."""
    import subprocess
    import sys

    code = ("import sys; from credo.algo.critic import list_critic_losses; from credo.models.value import CRITIC_HEADS; "
            "mods = ('credo.methods.dvpo.critic', 'credo.methods.dfpo.critic', 'credo.methods.dfpo.flow_head'); "
            "before = any(m in sys.modules for m in mods); losses = list_critic_losses(); heads = CRITIC_HEADS.names(); "
            "print(before, all(m in sys.modules for m in mods), losses, heads)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 2)[:2] == ["False", "True"]
    assert "['clipped_mse', 'dfpo', 'dvpo', 'vrpo'] ['flow', 'quantile', 'scalar', 'vib']" in out.stdout
