"""Reward models: Bradley-Terry and pointwise losses (hand-computed), CRM's peer selection and schedules,
preference data (files with bad rows, generated pairs with noise), and `credo rm train` through the CLI."""
from __future__ import annotations

import json
import math

import pytest
import torch

from credo.methods.reward_models.algo import (bradley_terry_loss, curriculum_order, keep_ratio_schedule, peer_select,
                                     pointwise_loss)
from credo.methods.reward_models.pairs import generate_pairs, load_pairs


def test_bradley_terry_loss_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])
    # differences 2 and -1: -log sigma(2) = log(1 + e^-2) = 0.126928, -log sigma(-1) = log(1 + e) = 1.313262
    loss, m = bradley_terry_loss(chosen, rejected)
    assert float(loss) == pytest.approx((math.log1p(math.exp(-2)) + math.log1p(math.exp(1))) / 2, rel=1e-6)
    assert float(loss) == pytest.approx(0.720095, abs=1e-6)
    assert m == {"rm/accuracy": 0.5, "rm/margin": 0.5}
    # margin 1: differences 1 and -2 -> (log(1 + e^-1) + log(1 + e^2)) / 2 = (0.313262 + 2.126928) / 2
    assert float(bradley_terry_loss(chosen, rejected, margin=1.0)[0]) == pytest.approx(1.220095, abs=1e-6)
    # weights [1, 0]: the second pair is left out
    assert float(bradley_terry_loss(chosen, rejected, weights=torch.tensor([1.0, 0.0]))[0]) == \
        pytest.approx(0.126928, abs=1e-6)
    # gradient: d/dr_w of -log sigma(d) = -(1 - sigma(d)) / B
    c = chosen.clone().requires_grad_(True)
    bradley_terry_loss(c, rejected)[0].backward()
    torch.testing.assert_close(c.grad, -(1 - torch.sigmoid(torch.tensor([2.0, -1.0]))) / 2)


def test_pointwise_loss_by_hand():
    # BCE(logit 0, label 1) = log 2; BCE(logit 2, label 0) = log(1 + e^2) = 2.126928
    loss, m = pointwise_loss(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx((math.log(2) + math.log1p(math.exp(2))) / 2, rel=1e-6)
    assert m["rm/accuracy"] == 0.0  # logit 0 is not > 0 for the positive; logit 2 says positive for the negative


def test_peer_selection_keeps_the_largest_margins():
    margins = torch.tensor([0.5, -1.0, 2.0, 0.5])
    # keep ceil(0.5 * 4) = 2: the 2.0 pair, then the first of the tied 0.5 pairs
    assert peer_select(margins, 0.5).tolist() == [True, False, True, False]
    assert peer_select(margins, 0.6).tolist() == [True, False, True, True]  # ceil(2.4) = 3
    assert peer_select(margins, 0.01).tolist() == [False, False, True, False]  # at least one
    assert peer_select(margins, 1.0).all()


def test_keep_ratio_schedule_and_curriculum_order():
    # linear from 1 to 0.6 over the first half of 100 steps
    assert [keep_ratio_schedule(s, 100, final=0.6, warmup=0.5) for s in (0, 25, 50, 99)] == \
        pytest.approx([1.0, 0.8, 0.6, 0.6])
    assert keep_ratio_schedule(0, 10, final=0.5, warmup=0.0) == 1.0 and \
        keep_ratio_schedule(1, 10, final=0.5, warmup=0.0) == 0.5  # no warm-up: the final share from step 1
    # mean margins 2, -1, 1 -> easy to hard: 0, 2, 1
    assert curriculum_order(torch.tensor([1.0, -1.0, 3.0]), torch.tensor([1.0, 0.0, -2.0])).tolist() == [0, 2, 1]


def test_preference_files_skip_bad_rows(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "a"},
            {"prompt": "p", "chosen": "a", "rejected": "a"}, "not a dict", {"prompt": 1, "chosen": "a", "rejected": "b"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    pairs, bad = load_pairs(path)
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("p", "a", "b")]
    assert [b.line for b in bad] == [2, 3, 4, 5, 6]
    (tmp_path / "empty.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="no usable preference pairs"):
        load_pairs(tmp_path / "empty.jsonl")


def test_generated_pairs_prefer_the_verified_answer_and_flip_exactly_the_noise_share():
    from credo.rewards import get_reward_fn

    train, held_out = generate_pairs("reversal", {}, train_size=50, eval_size=10, seed=3, noise=0.2)
    assert sum(p.flipped for p in train) == 10 and not any(p.flipped for p in held_out)
    verify = get_reward_fn("exact_match")
    from credo.types import Example

    for p in train + held_out:
        ex = Example(p.prompt, p.prompt[4:-1][::-1])  # "rev abc=" -> "cba"
        good, other = (p.rejected, p.chosen) if p.flipped else (p.chosen, p.rejected)
        assert verify(good, ex).score == 1.0 and verify(other, ex).score == 0.0
        assert set(other) <= set(good)  # corrupted with the answer's own characters
    again, _ = generate_pairs("reversal", {}, train_size=50, eval_size=10, seed=3, noise=0.2)
    assert again == train  # reproducible


@pytest.mark.parametrize("method", ["bt", "crm"])
def test_rm_train_cli_writes_models_metrics_and_summary(tmp_path, method):
    from credo.cli.main import main
    from credo.models import ValueModel

    run = tmp_path / method
    assert main(["-q", "rm", "train", "--run-dir", str(run), f"rm.method={method}", "rm.pairs=64",
                 "rm.eval_pairs=16", "rm.steps=6", "rm.batch_size=8", "rm.eval_every=3", "rm.noise=0.25",
                 "log.tensorboard=false", "log.progress=false", "warm_start.steps=2", "rm.pooling=mean"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_pairs"] == 64 and summary["flipped_pairs"] == 16 and summary["eval_pairs"] == 16
    assert 0.0 <= summary["final/eval/pairwise_acc"] <= 1.0
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval/pairwise_acc" in r] == [0, 3, 6]
    ValueModel.load(run / "reward_model")  # loads back
    if method == "crm":
        heads = [ValueModel.load(run / d).value_head.weight for d in ("reward_model", "reward_model_b")]
        assert not torch.equal(*heads)  # the peers differ (identical peers would make the review a no-op)
        assert "final/eval/pairwise_acc_b" in summary
        assert any("crm/dropped_noisy_frac_a" in r for r in rows)  # the filter's precision is measured
        assert [r["crm/keep_ratio"] for r in rows if "crm/keep_ratio" in r][-1] < 1.0
    assert main(["-q", "rm", "train", "--run-dir", str(tmp_path / "bad"), "rm.train_file=/nonexistent.jsonl"]) == 1


def test_rm_scores_read_the_last_token_or_the_response_mean(tiny_model):
    from credo.models import ValueModel
    from credo.methods.reward_models.train import response_batch, rm_scores

    model, tok = tiny_model
    rm = ValueModel.from_policy(model)
    torch.nn.init.normal_(rm.value_head.weight, std=1.0)
    batch = response_batch(tok, ["rev abc=", "rev hgfedc="], ["cba", "cdefghxx"])  # different lengths
    with torch.no_grad():
        values = rm(batch.input_ids, batch.attention_mask, batch.position_ids)  # (B, L)
        p = batch.prompt_len
        n = batch.response_mask.sum(-1).long()  # response tokens incl. EOS: 4 and 9
        assert n.tolist() == [4, 9]
        want_last = torch.stack([values[i, p + n[i] - 1] for i in range(2)])  # the EOS column
        want_mean = torch.stack([values[i, p : p + n[i]].mean() for i in range(2)])
        torch.testing.assert_close(rm_scores(rm, batch, "last"), want_last)
        torch.testing.assert_close(rm_scores(rm, batch, "mean"), want_mean)


def test_implicit_reward_is_beta_times_the_summed_log_ratio(tiny_model, tmp_path):
    from credo.models import ValueModel
    from credo.models.implicit import ImplicitRewardModel
    from credo.methods.reward_models.train import response_batch, rm_scores

    model, tok = tiny_model
    rm = ImplicitRewardModel.from_policy(model, beta=0.5)
    batch = response_batch(tok, ["rev abc=", "rev hgfedc="], ["cba", "cdefghxx"])
    assert torch.equal(rm_scores(rm, batch), torch.zeros(2))  # pi == pi_ref at the start: every reward 0
    with torch.no_grad():
        for p in rm.lm.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # by hand: r = 0.5 * sum over the response tokens (incl. EOS) of log pi(y_t) - log pi_ref(y_t)
    want = []
    p_len = batch.prompt_len
    for b in range(2):
        n = int(batch.response_mask[b].sum())
        ids = batch.input_ids[b : b + 1, : p_len + n]
        kw = dict(attention_mask=batch.attention_mask[b : b + 1, : p_len + n],
                  position_ids=batch.position_ids[b : b + 1, : p_len + n])
        with torch.no_grad():
            lp = [torch.log_softmax(m(input_ids=ids, **kw).logits[0].float(), -1) for m in (rm.lm, rm.reference[0])]
        want.append(0.5 * sum(float(lp[0][p_len + t - 1, ids[0, p_len + t]] - lp[1][p_len + t - 1, ids[0, p_len + t]])
                              for t in range(n)))
    got = rm_scores(rm, batch).detach()
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(got, torch.zeros(2))
    assert sum(p.numel() for p in rm.parameters()) == sum(p.numel() for p in model.parameters())  # ref not trained
    rm.save(tmp_path / "imp")
    again = ValueModel.load(tmp_path / "imp")  # the reward_model reward loads it the same way
    assert isinstance(again, ImplicitRewardModel) and again.beta == 0.5
    torch.testing.assert_close(rm_scores(again, batch).detach(), got)


def test_rm_train_implicit_learns_generated_pairs(tmp_path):
    from credo.cli.main import main

    run = tmp_path / "imp"
    assert main(["-q", "rm", "train", "--run-dir", str(run), "rm.model=implicit", "rm.pairs=64", "rm.eval_pairs=16",
                 "rm.steps=8", "rm.batch_size=8", "rm.eval_every=0", "log.tensorboard=false", "log.progress=false",
                 "warm_start.steps=2", "model.hidden_size=32", "model.intermediate_size=64"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["start/eval/pairwise_acc"] == 0.0  # every pair ties before training (a tie counts as wrong)
    assert summary["final/eval/pairwise_acc"] > 0.5
    assert (run / "reward_model" / "reference" / "config.json").is_file()
