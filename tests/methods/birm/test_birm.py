"""BiRM: step segmentation, Monte-Carlo labels, the two-head loss and score (hand-computed), the model's heads,
labelling with a scripted engine, best-of-N selection and beam search with a scripted model."""
from __future__ import annotations

import pytest
import torch

from credo.methods.birm.algo import birm_loss, birm_score, mc_labels, step_ends
from credo.rollout.hf import Continuation
from credo.methods.birm.train import label_steps, score_responses
from credo.methods.birm.search import beam_search, best_of_n
from credo.types import Example, RewardResult, SamplingParams, Trajectory


def test_step_ends():
    assert step_ends(5, 2) == [1, 3, 4]  # tokens 0-1 | 2-3 | 4: the last token always ends the last step
    assert step_ends(4, 2) == [1, 3]
    assert step_ends(1, 3) == [0]
    assert step_ends(0, 2) == []
    assert step_ends(6, 1, boundaries=[2, 9, 5]) == [2, 5]  # out-of-range boundaries dropped; 5 is the last token
    with pytest.raises(ValueError):
        step_ends(3, 0)


def test_mc_labels_soft_and_hard():
    soft, hard = mc_labels(torch.tensor([0, 3, 8]), 8)
    torch.testing.assert_close(soft, torch.tensor([0.0, 0.375, 1.0]))  # 3 / 8 = 0.375
    torch.testing.assert_close(hard, torch.tensor([0.0, 1.0, 1.0]))


def test_birm_loss_hand_computed():
    reward = torch.tensor([[0.5, 9.0, 1.0], [0.0, 0.2, 9.0]])
    value = torch.tensor([[0.4, 9.0, 0.5], [1.0, 0.0, 9.0]])
    rew_y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    val_y = torch.tensor([[0.5, 0.0, 1.0], [0.5, 0.25, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # the 9.0 predictions are unlabelled: ignored
    loss, m = birm_loss(reward, value, rew_y, val_y, mask)
    # value: (0.4-0.5)^2 + (0.5-1)^2 + (1-0.5)^2 + (0-0.25)^2 = 0.01 + 0.25 + 0.25 + 0.0625 = 0.5725; / B=2 = 0.28625
    # reward: (0.5-1)^2 + (1-1)^2 + (0-0)^2 + (0.2-1)^2 = 0.25 + 0 + 0 + 0.64 = 0.89; / 2 = 0.445
    assert m["birm/value_loss"] == pytest.approx(0.28625)
    assert m["birm/reward_loss"] == pytest.approx(0.445)
    assert float(loss) == pytest.approx(0.73125)
    # micro-batches: each half divided by the whole batch's B sums to the whole
    halves = [birm_loss(reward[i : i + 1], value[i : i + 1], rew_y[i : i + 1], val_y[i : i + 1], mask[i : i + 1],
                        batch_size=2)[0] for i in range(2)]
    assert float(sum(halves)) == pytest.approx(0.73125)


def test_birm_score_aggregations():
    r = torch.tensor([[0.2, 0.8, 0.5], [1.0, -1.0, 7.0]])
    v = torch.tensor([[0.1, 0.3, 0.9], [0.6, 0.4, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 1 has two steps; its third column is padding
    # row 0: V_last 0.9, mean R 0.5 -> 0.9 + 2 * 0.5 = 1.9; row 1: V_last 0.4, mean R 0.0 -> 0.4
    torch.testing.assert_close(birm_score(r, v, mask, beta=2.0), torch.tensor([1.9, 0.4]))
    torch.testing.assert_close(birm_score(r, v, mask, beta=1.0, agg="min"), torch.tensor([0.9 + 0.2, 0.4 - 1.0]))
    torch.testing.assert_close(birm_score(r, v, mask, beta=1.0, agg="max"), torch.tensor([0.9 + 0.8, 0.4 + 1.0]))
    torch.testing.assert_close(birm_score(r, v, mask, beta=1.0, agg="last"), torch.tensor([0.9 + 0.5, 0.4 - 1.0]))
    torch.testing.assert_close(birm_score(r, v, mask, beta=0.0), torch.tensor([0.9, 0.4]))  # the value head alone
    with pytest.raises(ValueError):
        birm_score(r, v, mask, agg="median")


def test_model_heads_start_as_the_spec_says(tmp_path):
    from credo.config import ModelConfig
    from credo.models import build_model
    from credo.methods.birm.model import BiRewardModel

    policy, tok = build_model(ModelConfig(hidden_size=32, intermediate_size=64), seed=0)
    model = BiRewardModel.from_policy(policy).eval()
    mean_emb = policy.get_output_embeddings().weight.detach().mean(0)
    for head in (model.reward_head, model.value_head):
        torch.testing.assert_close(head.linear.weight[0], mean_emb)  # weight = mean output-embedding vector
        assert head.gain.item() == 1.0 and head.shift.item() == 0.0 and head.linear.bias.item() == 0.0
        assert head.dropout.p == 0.2
    ids = torch.tensor([[3, 4, 5, 6]])
    attn, pos = torch.ones_like(ids), torch.arange(4).unsqueeze(0)
    reward, value, _ = model(ids, attn, pos)
    h = policy.base_model(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
    torch.testing.assert_close(reward, h @ mean_emb)  # eval mode: no dropout, g = 1, b = 0
    with torch.no_grad():
        model.value_head.gain.fill_(2.0)  # a trained scalar must survive the round trip
    model.save(tmp_path / "birm")
    again = BiRewardModel.load(tmp_path / "birm").eval()
    torch.testing.assert_close(again(ids, attn, pos)[0], reward)
    torch.testing.assert_close(again(ids, attn, pos)[1], model(ids, attn, pos)[1])


def test_logratio_heads_hand_computed():
    from credo.methods.birm.algo import logratio_heads

    lp = torch.tensor([[-1.0, -0.5, -2.0]])
    ref = torch.tensor([[-2.0, -0.5, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third position is padding
    reward, value = logratio_heads(lp, ref, mask, beta=0.5, reward_bias=0.0, value_bias=-1.0)
    # log-ratios 1, 0, (masked); Q = 0.5 * cumsum = 0.5, 0.5, 0.5
    q = torch.tensor([[0.5, 0.5, 0.5]])
    torch.testing.assert_close(reward, torch.sigmoid(q))
    torch.testing.assert_close(value, torch.sigmoid(q - 1.0))


def test_logratio_birm_starts_neutral_and_round_trips(tmp_path):
    from credo.config import ModelConfig
    from credo.models import build_model
    from credo.methods.birm.model import BiRewardModel, LogRatioBiRM
    from credo.models.batch import token_batch

    policy, tok = build_model(ModelConfig(hidden_size=32, intermediate_size=64), seed=0)
    model = LogRatioBiRM.from_policy(policy, beta=0.3)
    batch = token_batch([[1, 5, 6], [1, 7]], [[8, 9, 2], [10, 2]], pad_id=tok.pad_token_id)
    reward, value = model.step_heads(batch)
    # the LM is still the generator: every log-ratio is 0, so both heads read sigmoid(0 + 0) = 0.5
    torch.testing.assert_close(reward, torch.full((2, 3), 0.5))
    torch.testing.assert_close(value, torch.full((2, 3), 0.5))
    assert not any(p.requires_grad for p in model.reference[0].parameters())
    with torch.no_grad():  # a trained model: the LM moved, the biases learned
        model.lm.get_output_embeddings().weight.mul_(1.5)
        model.value_bias.fill_(-0.7)
    before = model.step_heads(batch)
    model.save(tmp_path / "birm")
    again = BiRewardModel.load(tmp_path / "birm")  # the loader dispatches on birm.json
    assert isinstance(again, LogRatioBiRM) and again.beta == 0.3
    for a, b in zip(again.step_heads(batch), before):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(before[1], torch.full((2, 3), 0.5))


# ------------------------------------------------------------------ scripted engine, runner and model

class Tok:
    pad_token_id, eos_token_id = 0, 1

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(96 + i) for i in ids if i > 1)  # 2 -> "b", 3 -> "c", ...


class ScriptedEngine:
    """generate: every sample of a prompt is ``responses[k]`` in turn; continue_ids: the continuation of a prefix is
    the right answer's rest if the prefix is still a prefix of it, else one wrong token."""

    def __init__(self, responses, answer_ids):
        self.responses, self.answer_ids, self.calls = responses, answer_ids, []

    def encode(self, text):
        return [5, 5]

    def generate(self, examples, n, sampling):
        return [Trajectory(example=ex, group_id=g, prompt_ids=[5, 5], response_ids=list(self.responses[k]),
                           rollout_logprobs=[-0.1 * (k + 1)] * len(self.responses[k]), response_mask=[1],
                           finish_reason="eos", response_text=Tok().decode(self.responses[k]))
                for g, ex in enumerate(examples) for k in range(n)]

    def continue_ids(self, prefixes, sampling):
        self.calls.append(sampling.max_new_tokens)
        out = []
        for p in prefixes:
            resp = p[2:]
            good = resp == self.answer_ids[: len(resp)]
            ids = (self.answer_ids[len(resp):] if good else [9]) + [1]
            out.append(Continuation(ids=ids[: sampling.max_new_tokens], logprobs=[0.0] * len(ids),
                                    finish_reason="stop"))
        return out


class ExactRunner:
    def score(self, texts, examples):
        return [RewardResult(float(t == e.answer), correct=t == e.answer) for t, e in zip(texts, examples)]


def test_label_steps_with_scripted_rollouts():
    answer = [2, 3, 4, 5]  # "bcde"
    engine = ScriptedEngine([[2, 3, 4, 5, 1], [2, 7, 4, 5, 1]], answer)
    ex = Example("p", "bcde")
    samples = label_steps(engine, ExactRunner(), Tok(), [ex], samples=2, rollouts=3, step_tokens=2,
                          sampling=SamplingParams(max_new_tokens=6))
    right, wrong = samples
    assert right.ends == [1, 3, 4]  # "bc" | "de" | EOS
    # right: both prefixes continue to the answer -> soft 1, hard 1; the last step is the response's own outcome (1)
    assert right.value_labels == [1.0, 1.0, 1.0] and right.reward_labels == [1.0, 1.0, 1.0] and right.correct
    # wrong ("bg..."): its prefixes have left the answer -> every continuation fails
    assert wrong.value_labels == [0.0, 0.0, 0.0] and wrong.reward_labels == [0.0, 0.0, 0.0] and not wrong.correct
    assert sorted(engine.calls) == [2, 4]  # prefixes of 4 and 2 tokens get the rest of the 6-token budget


class ScriptedBiRM(torch.nn.Module):
    """reward = value = the token id at each position: the score of a response is its last step's token id plus
    beta times the mean of its step-end token ids."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask, position_ids, with_logits=False):
        x = input_ids.float() + 0 * self.w
        return x, x, None

    from credo.methods.birm.model import BiRewardModel

    step_heads = BiRewardModel.step_heads  # the response span of forward's outputs


def test_score_responses_reads_the_step_ends():
    s = score_responses(ScriptedBiRM(), Tok(), [[5, 5], [5]], [[2, 3, 4], [6, 8]], step_tokens=2, beta=0.5)
    # row 0: steps end at tokens 1 and 2 (ids 3, 4): V_last 4, mean R 3.5 -> 4 + 0.5 * 3.5 = 5.75
    # row 1: one step ending at token 1 (id 8): 8 + 0.5 * 8 = 12
    torch.testing.assert_close(s["score"], torch.tensor([5.75, 12.0]))
    torch.testing.assert_close(s["value"], torch.tensor([4.0, 8.0]))
    torch.testing.assert_close(s["reward"], torch.tensor([3.5, 8.0]))


def test_best_of_n_selectors():
    # three samples per prompt: [2,3,4,5] correct (lowest sampled log-prob), [9,9] and [2,3,9] wrong
    engine = ScriptedEngine([[9, 9], [2, 3, 9], [2, 3, 4, 5]], [2, 3, 4, 5])
    out = best_of_n(engine, ExactRunner(), ScriptedBiRM(), Tok(), [Example("p", "bcde")], n=3,
                    sampling=SamplingParams(), step_tokens=2)
    # scores: [9,9]: 9 + 9 = 18; [2,3,9]: 9 + (3 + 9)/2 = 15; [2,3,4,5]: 5 + (3 + 5)/2 = 9 -> BiRM picks [9, 9]
    assert out["bon/birm"] == 0.0 and out["bon/value"] == 0.0
    # sampled log-probs -0.1, -0.2, -0.3 per token: the sum prefers sample 0 (wrong), so does the mean
    assert out["bon/logprob_sum"] == 0.0 and out["bon/logprob_mean"] == 0.0
    assert out["bon/avg"] == pytest.approx(1 / 3) and out["bon/pass"] == 1.0


def test_beam_search_follows_the_score():
    class Branching(ScriptedEngine):
        """Per beam, two offers: the first step is [2, 3] or [7, EOS]; later steps [4, EOS] or [8, 8]."""

        def continue_ids(self, prefixes, sampling):
            outs = []
            for i, p in enumerate(prefixes):
                first = len(p) == 2
                ids = ([2, 3] if first else [4, 1]) if i % 2 == 0 else ([7, 1] if first else [8, 8])
                outs.append(Continuation(ids=ids, logprobs=[0.0] * 2, finish_reason="stop" if ids[-1] == 1
                                         else "length"))
            return outs

    [ids] = beam_search(Branching([], []), ScriptedBiRM(), Tok(), [Example("p", "")], beam_width=1, expand=2,
                      step_tokens=2, sampling=SamplingParams(max_new_tokens=6))
    # round 1: [2, 3] scores 3 + 3 = 6, [7, EOS] (finished) 1 + 1 = 2 -> keep [2, 3]
    # round 2: [2, 3, 4, EOS] (finished) 1 + (3 + 1)/2 = 3; [2, 3, 8, 8] 8 + (3 + 8)/2 = 13.5 -> keep the latter
    # round 3: [2, 3, 8, 8, 4, EOS] 1 + (3 + 8 + 1)/3 = 5; [2, 3, 8, 8, 8, 8] (the 6-token budget: finished)
    #          8 + (3 + 8 + 8)/3 = 14.33 -> kept, all finished
    assert ids == [2, 3, 8, 8, 8, 8]


@pytest.mark.parametrize("heads", ["linear", "logratio"])
def test_birm_recipe_through_the_cli(tmp_path, heads):
    import json

    from credo.cli.main import main
    from credo.methods.birm.model import BiRewardModel, LogRatioBiRM
    from tests.conftest import TINY_RUN

    run = tmp_path / "run"
    rm_args = [a for a in TINY_RUN if not a.startswith("eval.")]  # credo rm train has no eval section
    assert main(["rm", "train", "--run-dir", str(run), *rm_args, "rm.method=birm", f"birm.heads={heads}",
                 "birm.prompts=4", "birm.samples=2", "birm.rollouts=2", "birm.steps=2", "birm.batch_size=4",
                 "birm.eval_prompts=4", "birm.best_of=2", "birm.beam_width=1", "birm.beam_expand=1",
                 "log.progress=false"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["labelled_responses"] == 8 and summary["best_of"] == 2
    for key in ("final/bon/birm", "final/bon/logprob_sum", "final/bon/pass", "final/eval/beam_acc"):
        assert 0.0 <= summary[key] <= 1.0, key
    model = BiRewardModel.load(run / "birm")
    assert isinstance(model, LogRatioBiRM) == (heads == "logratio")
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("birm/value_loss" in r for r in steps)
