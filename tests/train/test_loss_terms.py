"""credo.train.loss_terms: the policy loss plus the registered terms, each computed by hand."""
from __future__ import annotations

import torch

from credo.algo import AggNorm
from credo.config import load_config
from credo.train.loss_terms import LOSS_TERMS, EntropyTerm, KLTerm, SFTTerm, TermInputs, build_loss_terms
from credo.types import TrainBatch


def _batch() -> TrainBatch:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    z = torch.zeros(2, 3)
    return TrainBatch(input_ids=torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 4, dtype=torch.long),
                      position_ids=torch.zeros(2, 4, dtype=torch.long), responses=torch.zeros(2, 3, dtype=torch.long),
                      response_mask=mask, prompt_len=1, rollout_logprobs=z, scores=torch.tensor([1.0, 0.0]),
                      group_ids=torch.tensor([0, 0]), ref_logprobs=torch.full((2, 3), -1.0))


def test_terms_by_hand():
    b = _batch()
    logprobs = torch.full((2, 3), -0.5)
    entropy = torch.tensor([[1.0, 3.0, 9.0], [2.0, 2.0, 2.0]])
    x = TermInputs(logprobs, entropy, b, "token-mean", AggNorm.of(b.response_mask, 3.0))
    # k1 KL = logprobs - ref = -0.5 - (-1) = 0.5 on each of the 5 tokens: token-mean 0.5
    coef, value = KLTerm(0.1, "k1")(x)
    assert coef == 0.1 and float(value) == 0.5
    # entropy bonus: token-mean over the 5 tokens = (1 + 3 + 2 + 2 + 2) / 5 = 2.0, with coefficient -c
    coef, value = EntropyTerm(0.01)(x)
    assert coef == -0.01 and float(value) == 2.0
    # SFT on the correct row only (score 1.0): NLL 0.5 on its 2 tokens, normalised over the correct tokens
    sft = SFTTerm(0.1, 1.0)
    prepared = sft.prepare(b, 3.0)
    coef, value = sft(TermInputs(logprobs, entropy, b, "token-mean", AggNorm.of(b.response_mask, 3.0), prepared))
    assert coef == 0.1 and float(value) == 0.5
    # no correct response in the mini-batch: no contribution at all
    b.scores = torch.tensor([0.0, 0.0])
    assert sft(TermInputs(logprobs, entropy, b, "token-mean", x.norm, sft.prepare(b, 3.0))) is None


def test_the_config_enables_terms_in_their_summation_order():
    assert build_loss_terms(load_config()) == ()
    terms = build_loss_terms(load_config(None, ["algo.sft_coef=0.1", "algo.entropy_coef=0.01", "algo.kl_coef=0.02"]))
    assert [t.name for t in terms] == ["actor/kl_loss", "actor/entropy_loss", "actor/sft_loss"]
    assert terms[0] == KLTerm(0.02, "k3")
    # KL in the reward is a batch transform, not a loss term
    assert build_loss_terms(load_config(None, ["algo.kl_coef=0.02", "algo.kl_in_reward=true"])) == ()
    assert {"kl", "entropy", "sft", "distill"} <= set(LOSS_TERMS.names())  # distill: a built-in found by name
