"""VEPO: grounding-sensitivity math, span marking, perturbations, the perturbed forward on a tiny trained model,
and the preset through the CLI (docs/algorithms/vepo.md)."""
from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
import torch

from credo.methods.vepo.algo import (chunked_grounding_stats, entropy_gap_from_logits, grounding_sensitivity,
                                  jsd_from_logits, score_weights, top_fraction_mask, vepo_scores)
from credo.algo.logprobs import entropy_from_logits
from credo.config import ConfigError, load_config
from credo.data import build_splits, get_task
from credo.types import Example, Trajectory
from credo.methods.vepo.grounding import (example_spans, get_perturbation, perturbation_rng, prompt_offset,
                                   span_positions)
from credo.methods.vepo.select import (GroundingStats, apply_selection, grounding_stats, perturbed_batch, perturbed_prompts,
                              select)
from tests.conftest import TINY_RUN


def _probs_logits(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()


# ------------------------------------------------------------------------------------------ the math

def test_jsd_and_entropy_gap_by_hand():
    # p = (0.5, 0.5), q = (0.9, 0.1), m = (0.7, 0.3)
    # KL(p||m) = 0.5 ln(0.5/0.7) + 0.5 ln(0.5/0.3) = 0.5 (-0.336472) + 0.5 (0.510826) = 0.087177
    # KL(q||m) = 0.9 ln(0.9/0.7) + 0.1 ln(0.1/0.3) = 0.226183 - 0.109861 = 0.116322
    # JSD = (0.087177 + 0.116322) / 2 = 0.101749
    # H(p) = ln 2 = 0.693147, H(q) = -(0.9 ln 0.9 + 0.1 ln 0.1) = 0.094824 + 0.230259 = 0.325083
    p, q = _probs_logits([0.5, 0.5]), _probs_logits([0.9, 0.1])
    assert float(jsd_from_logits(p, q)) == pytest.approx(0.101749, abs=1e-6)
    assert float(jsd_from_logits(q, p)) == pytest.approx(0.101749, abs=1e-6)  # symmetric
    assert float(entropy_gap_from_logits(p, q)) == pytest.approx(0.325083 - 0.693147, abs=1e-6)  # H(q) - H(p)
    # identical distributions: 0; disjoint supports: ln 2 (the bound), with -inf logits handled
    assert float(jsd_from_logits(p, p)) == pytest.approx(0.0, abs=1e-12)
    disjoint = jsd_from_logits(torch.tensor([0.0, -math.inf]), torch.tensor([-math.inf, 0.0]))
    assert float(disjoint) == pytest.approx(math.log(2), abs=1e-6)
    # shift invariance of logits and (B, T, V) shapes
    z = torch.randn(2, 3, 5, dtype=torch.float64)
    w = torch.randn(2, 3, 5, dtype=torch.float64)
    assert jsd_from_logits(z, w).shape == (2, 3)
    assert torch.allclose(jsd_from_logits(z + 7.0, w), jsd_from_logits(z, w))


def test_chunked_stats_match_full_logits():
    g = torch.Generator().manual_seed(0)
    h1, h2 = torch.randn(7, 5, generator=g, dtype=torch.float64), torch.randn(7, 5, generator=g, dtype=torch.float64)
    weight = torch.randn(11, 5, generator=g, dtype=torch.float64)
    bias = torch.randn(11, generator=g, dtype=torch.float64)
    st = chunked_grounding_stats(h1, h2, weight, bias=bias, temperature=0.7, chunk_size=3)
    z1, z2 = (h1 @ weight.T + bias) / 0.7, (h2 @ weight.T + bias) / 0.7
    assert torch.allclose(st["jsd"], jsd_from_logits(z1, z2))
    assert torch.allclose(st["entropy"], entropy_from_logits(z1))
    assert torch.allclose(st["entropy_perturbed"], entropy_from_logits(z2))


def test_sensitivity_and_scores_by_hand():
    jsd = torch.tensor([[0.1, 0.3, 0.2], [0.4, 0.0, 9.0]])
    gap = torch.tensor([[0.5, -0.2, 0.1], [0.0, 0.2, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # Vis = JSD + max(gap, 0): [[0.6, 0.3, 0.3], [0.4, 0.2, (masked) 0]]
    vis = grounding_sensitivity(jsd, gap, mask)
    assert torch.allclose(vis, torch.tensor([[0.6, 0.3, 0.3], [0.4, 0.2, 0.0]]))
    # weights: 2 JSD + 0.5 gap+ = [[0.45, 0.6, 0.45], [0.8, 0.1, 0]]
    vis_w = grounding_sensitivity(jsd, gap, mask, jsd_weight=2.0, gap_weight=0.5)
    assert torch.allclose(vis_w, torch.tensor([[0.45, 0.6, 0.45], [0.8, 0.1, 0.0]]))
    # sequence normalisation: row 0 JSD mean 0.2, gap+ mean 0.2 -> [0.5+2.5, 1.5+0, 1+0.5] = [3, 1.5, 1.5]
    # row 1 JSD mean 0.2, gap+ mean 0.1 -> [2+0, 0+2] = [2, 2]
    vis_n = grounding_sensitivity(jsd, gap, mask, normalize="sequence", eps=0.0)
    assert torch.allclose(vis_n, torch.tensor([[3.0, 1.5, 1.5], [2.0, 2.0, 0.0]]))
    # batch normalisation: JSD mean over 5 tokens = 1.0 / 5 = 0.2, gap+ mean = 0.8 / 5 = 0.16
    vis_b = grounding_sensitivity(jsd, gap, mask, normalize="batch", eps=0.0)
    assert torch.allclose(vis_b[0, 0], torch.tensor(0.1 / 0.2 + 0.5 / 0.16))
    # score = Vis * H
    entropy = torch.tensor([[1.0, 2.0, 0.5], [0.5, 4.0, 3.0]])
    assert torch.allclose(vepo_scores(vis, entropy, mask), torch.tensor([[0.6, 0.6, 0.15], [0.2, 0.8, 0.0]]))


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.2, 0.5, 0.99, 1.0])
def test_selection_fraction_is_honoured(fraction):
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(6, 9, generator=g)
    scores[0, :4] = 0.5  # ties
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    mask[5] = 0.0  # an empty row
    n = int(mask.sum())
    keep = top_fraction_mask(scores, mask, fraction=fraction, scope="batch")
    assert int(keep.sum()) == math.ceil(fraction * n - 1e-9)
    assert not (keep & ~mask.bool()).any()
    if keep.any() and (~keep & mask.bool()).any():  # every kept score >= every dropped valid score
        assert scores[keep].min() >= scores[~keep & mask.bool()].max()
    per_row = top_fraction_mask(scores, mask, fraction=fraction, scope="sequence")
    for row in range(6):
        n_row = int(mask[row].sum())
        assert int(per_row[row].sum()) == math.ceil(fraction * n_row - 1e-9)
    assert not (per_row & ~mask.bool()).any()


def test_selection_ties_break_by_position_and_weights():
    scores = torch.ones(2, 4)
    mask = torch.ones(2, 4)
    keep = top_fraction_mask(scores, mask, fraction=0.25)  # k = 2 of 8 equal scores: the first two positions
    assert keep.tolist() == [[True, True, False, False], [False] * 4]
    with pytest.raises(ValueError):
        top_fraction_mask(scores, mask, fraction=1.5)
    # reweight: score / mean(score) over valid tokens, capped; mean of [1, 3, 0, (masked)] = 4/3
    s = torch.tensor([[1.0, 3.0, 0.0, 5.0]])
    w = score_weights(s, torch.tensor([[1.0, 1.0, 1.0, 0.0]]), max_weight=2.0)
    assert torch.allclose(w, torch.tensor([[0.75, 2.0, 0.0, 0.0]]))
    assert torch.equal(score_weights(torch.zeros(1, 3), torch.ones(1, 3)), torch.ones(1, 3))  # no signal: weight 1


def test_apply_modes():
    stats = GroundingStats(jsd=torch.tensor([[0.5, 0.0, 0.1, 0.0]]), entropy=torch.ones(1, 4),
                           entropy_perturbed=torch.ones(1, 4))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    batch = dataclasses.make_dataclass("B", ["response_mask", "advantages"])(mask, torch.full((1, 4), 2.0))
    sel = select(stats, mask, top_fraction=0.34, apply="mask")  # k = ceil(0.34 * 3) = 2: tokens 0 and 2
    assert sel.selected.tolist() == [[True, False, True, False]]
    out = apply_selection(batch, sel, "mask")
    assert out.response_mask.tolist() == [[1.0, 0.0, 1.0, 0.0]] and out.advantages.tolist() == [[2.0] * 4]
    sel = select(stats, mask, top_fraction=0.34, apply="advantage_mask")
    out = apply_selection(batch, sel, "advantage_mask")
    assert out.response_mask.tolist() == mask.tolist() and out.advantages.tolist() == [[2.0, 0.0, 2.0, 0.0]]
    sel = select(stats, mask, apply="reweight", max_weight=10.0)  # scores [0.5, 0, 0.1], mean 0.2
    out = apply_selection(batch, sel, "reweight")
    assert torch.allclose(out.advantages, torch.tensor([[5.0, 0.0, 1.0, 0.0]]))


# ------------------------------------------------------------------------------------------ spans, perturbations

def test_tasks_mark_their_grounding_spans():
    for name in ("reversal", "addition", "countdown"):
        train, eval_ = build_splits(get_task(name), train_size=40, eval_size=10, seed=3)
        for ex in train + eval_:
            spans = ex.meta["grounding"]
            inside = [ex.prompt[s:e] for s, e in spans]
            outside = "".join(c for i, c in enumerate(ex.prompt) if i not in set(span_positions(spans)))
            if name == "reversal":
                assert inside == [ex.answer[::-1]] and outside == "rev ="
            elif name == "addition":
                assert [int(x) for x in inside] and sum(map(int, inside)) == int(ex.answer) and outside == "+="
            else:
                assert inside == [str(n) for n in ex.meta["numbers"]] + [str(ex.meta["target"])]
                assert outside == " " * len(ex.meta["numbers"]) + "to :"


def test_span_marking_leaves_the_data_unchanged():
    ex = build_splits(get_task("reversal"), train_size=1, eval_size=0, seed=0)[0][0]
    assert (ex.prompt, ex.answer, ex.uid) == ("rev fdcd=", "dcdf", "reversal/train/0")
    ex = build_splits(get_task("countdown"), train_size=1, eval_size=0, seed=0)[0][0]
    assert set(ex.meta) == {"numbers", "target", "grounding"}


@pytest.mark.parametrize("name", ["shuffle", "random", "mask"])
def test_perturbations_keep_text_outside_the_spans(name):
    fn = get_perturbation(name)
    text = "3 57 to 12: keep THIS"
    spans = [(0, 1), (2, 4), (8, 10)]
    inside = span_positions(spans)
    for seed in range(20):
        out = fn(text, spans, random.Random(seed))
        assert len(out) == len(text)
        assert all(out[i] == text[i] for i in range(len(text)) if i not in inside)
        assert out == fn(text, spans, random.Random(seed))  # deterministic per rng
        got = [out[i] for i in inside]
        if name == "shuffle":
            assert sorted(got) == sorted(text[i] for i in inside)
        elif name == "random":
            assert all(g != text[i] and g.isdigit() for g, i in zip(got, inside))
        else:
            assert got == ["_"] * len(inside)
    assert fn(text, spans, random.Random(0)) != text
    assert get_perturbation("mask")("abc", [(1, 2)], random.Random(0), fill="#") == "a#c"
    assert get_perturbation("random")("rev abc=", [(4, 7)], random.Random(0), alphabet="ab").count("c") == 0


def test_perturbation_registry_and_rng():
    assert get_perturbation("credo.methods.vepo.grounding:mask") is get_perturbation("mask")
    with pytest.raises(KeyError, match="unknown perturbation"):
        get_perturbation("blur")
    with pytest.raises(KeyError, match="cannot import"):
        get_perturbation("nope.module:fn")
    a = perturbation_rng(0, 3, 7).random()
    assert a == perturbation_rng(0, 3, 7).random() and a != perturbation_rng(0, 3, 8).random()


def test_spans_through_templates_and_missing_spans():
    assert prompt_offset("{prompt}") == 0
    assert prompt_offset("Q: {prompt} A:") == 3
    meta = {"grounding": [[4, 7]]}
    assert example_spans(meta, offset=3, text_len=14) == [(7, 10)]
    with pytest.raises(ValueError, match="no grounding span"):
        example_spans({}, offset=0, text_len=5, uid="file:x/3")
    with pytest.raises(ValueError, match="does not fit"):
        example_spans({"grounding": [[2, 9]]}, offset=0, text_len=5)
    with pytest.raises(ValueError, match="pairs"):
        example_spans({"grounding": "abc"}, offset=0, text_len=5)


# ------------------------------------------------------------------------------------------ the tiny model

def _demo_trajs(tokenizer, examples):
    from credo.models.tokenizer import encode_prompt, encode_response

    out = []
    for ex in examples:
        resp = encode_response(tokenizer, ex.answer)
        out.append(Trajectory(example=ex, group_id=0, prompt_ids=encode_prompt(tokenizer, ex.prompt),
                              response_ids=resp, rollout_logprobs=[0.0] * len(resp), response_mask=[1] * len(resp),
                              finish_reason="eos"))
    return out


def test_copied_tokens_are_more_grounding_sensitive_than_fixed_ones():
    """A 2-layer model after a short SFT on reversal: the characters it copies from the grounding span react to
    the span's perturbation (high JSD); the EOS token, whose position depends only on the span's length (kept by
    the shuffle), does not. An untrained model shows no such gap, and a misaligned forward would not either."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: one thread is fastest, and the box is shared
    try:
        _copy_sensitivity_check()
    finally:
        torch.set_num_threads(threads)


def _copy_sensitivity_check():
    from credo.config import ModelConfig
    from credo.models import build_model
    from credo.models.batch import collate
    from credo.train.forward import NAIVE, ForwardOptions
    from credo.train.sft import run_sft
    from credo.types import RewardResult

    torch.manual_seed(0)
    model, tok = build_model(ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                         num_kv_heads=2, max_position_embeddings=64), seed=0)
    train, eval_ = build_splits(get_task("reversal"), train_size=2000, eval_size=32, seed=0)
    trajs = _demo_trajs(tok, eval_)
    batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
    prompts = perturbed_prompts(trajs, perturb="shuffle", perturb_args={}, seed=0, step=0)
    perturbed = perturbed_batch(trajs, prompts, tok)
    eos = batch.responses == tok.eos_token_id
    copied = batch.response_mask.bool() & ~eos

    def vis():
        st = grounding_stats(model, batch, perturbed, micro_batch_size=8, opts=ForwardOptions(chunk_size=16))
        return grounding_sensitivity(st.jsd, st.gap, batch.response_mask), st

    before, _ = vis()
    assert before[copied].mean() < 0.01  # untrained: nothing is copied, nothing reacts to the span
    run_sft(model, tok, train, lambda e: e.answer, steps=150, batch_size=32, lr=3e-3, seed=0)
    after, st = vis()
    changed = torch.tensor([p != t.example.prompt for p, t in zip(prompts, trajs)])
    copied = copied & changed[:, None]  # rows like "aaa" shuffle to themselves
    # medians: a few EOS positions of a half-trained model still hesitate between ending and copying on
    assert after[copied].median() > 10 * after[eos].median(), (after[copied].median(), after[eos].median())
    assert after[copied].mean() > 3 * after[eos].mean() and after[copied].mean() > 0.1
    # VEPO's top 20% by Vis * H are copied characters
    selected = select(st, batch.response_mask, top_fraction=0.2).selected
    assert float((selected & eos).sum()) <= 0.05 * float(selected.sum())
    # the naive full-logits path gives the same numbers
    naive = grounding_stats(model, batch, perturbed, opts=NAIVE)
    assert torch.allclose(naive.jsd, st.jsd, atol=1e-5) and torch.allclose(naive.entropy, st.entropy, atol=1e-5)


def test_grounding_forward_paths_agree(tiny_model):
    """Naive logits, chunked, packed and shared-prompt forwards give the same statistics (micro-batched)."""
    from credo.models.tokenizer import build_char_tokenizer
    from credo.models.batch import collate
    from credo.train.forward import NAIVE, ForwardOptions
    from credo.types import RewardResult

    tok = build_char_tokenizer()
    examples = build_splits(get_task("countdown"), train_size=8, eval_size=0, seed=0)[0]
    trajs = _demo_trajs(tok, examples + examples[:3])  # repeated prompts for the shared-prompt forward
    batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
    pb = perturbed_batch(trajs, perturbed_prompts(trajs, perturb="random", perturb_args={}, seed=0, step=0), tok)
    model = tiny_model[0]
    ref = grounding_stats(model, batch, pb, opts=NAIVE)
    assert float(ref.jsd.sum()) > 0
    for opts in (ForwardOptions(), ForwardOptions(chunk_size=5), ForwardOptions(pack=True, row_tokens=64),
                 ForwardOptions(share_prompt=True)):
        st = grounding_stats(model, batch, pb, micro_batch_size=4, opts=opts)
        for a, b in ((st.jsd, ref.jsd), (st.entropy, ref.entropy), (st.entropy_perturbed, ref.entropy_perturbed)):
            assert torch.allclose(a, b, atol=1e-5), opts


def test_perturbed_batch_keeps_responses_and_rejects_foreign_prompt_ids():
    from credo.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    ex = Example("rev abc=", "cba", uid="u", meta={"grounding": [(4, 7)]})
    trajs = _demo_trajs(tok, [ex, ex])
    prompts = perturbed_prompts(trajs, perturb="mask", perturb_args={}, seed=0, step=0)
    assert prompts == ["rev ___="] * 2
    pb = perturbed_batch(trajs, prompts, tok)
    assert pb.responses.tolist() == [tok("cba", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]] * 2
    trajs[0].prompt_ids = trajs[0].prompt_ids + [5]
    with pytest.raises(ValueError, match="re-tokenise"):
        perturbed_batch(trajs, prompts, tok)
    with pytest.raises(ValueError, match="no grounding span"):
        perturbed_prompts(_demo_trajs(tok, [Example("x", "y", uid="file:a/1")]), perturb="mask", perturb_args={},
                          seed=0, step=0)


# ------------------------------------------------------------------------------------------ config and recipe

def test_config_validation_and_no_fused_old_logprobs():
    cfg = load_config("vepo")
    v = cfg.token_select
    assert v.type == "vepo" and v.top_fraction == 0.2 and v.perturb == "shuffle"
    for bad, match in ((["token_select.perturb=blur"], "token_select.perturb"),
                       (["token_select.perturb_args.sigma=1"], "token_select.perturb_args"),
                       (["algo.top_entropy_quantile=0.2"], "choose one"),  # the old key: one selection at a time
                       (["token_select.apply=nope"], "token_select.apply")):
        with pytest.raises(ConfigError, match=match):
            load_config("vepo", bad)
    from credo.recipes.stages import build_plan
    from credo.train.transforms import BuildContext, build_transforms

    def fused(c) -> bool:  # the plan the run derives from its transforms' declarations
        plan = build_plan(c, build_transforms(BuildContext(c, None, None, Path("."))))
        return plan.fused(batch_size=64, ppo_epochs=1, mini_batch_size=None, mode="auto", collector_needs_pass=False)

    assert fused(load_config("grpo"))
    assert not fused(cfg)  # VEPO's selection reads the behaviour policy's log-probs: the pass stays


def test_preset_runs_through_the_cli(tmp_path: Path):
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics

    run = tmp_path / "vepo"
    code = main(["-q", "train", "--config", "vepo", "--run-dir", str(run), *TINY_RUN, "train.steps=2",
                 "eval.every=0", "log.report=false", "log.tensorboard=false", "task.prompt_template=Q {prompt}",
                 "reward.name=tests.reward_fixtures:length_score"])
    assert code == 0
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2
    for r in rows:
        n = r["perf/response_tokens"]
        assert r["token_select/frac"] == pytest.approx(math.ceil(0.2 * n - 1e-9) / n)
        for key in ("vepo/jsd_mean", "vepo/score_mean", "vepo/selected_entropy_mean", "vepo/prompt_changed_frac",
                    "timing_s/vepo", "actor/pg_loss"):
            assert key in r, key
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
