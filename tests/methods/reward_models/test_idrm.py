"""Interaction Distillation (spec seed-additions.md B.6): block extraction and renormalisation by hand, KL and MSE
rows, causal renormalisation, virtual attention against a manual softmax and against the model's own map, the
teacher's input layout, shapes, save / load and freezing, eager attention required, the token alignment, and
`credo rm train rm.method=idrm` through the CLI."""
from __future__ import annotations

import json
import math

import pytest
import torch

from credo.config import ConfigError
from credo.methods.reward_models.idrm.algo import (attention_mass_fifths, causal_allowed, gather_block, layer_pairs, masked_mean,
                                     renormalise, row_divergence, virtual_attention)
from credo.methods.reward_models.pairs import PreferencePair


def _five_token_map() -> torch.Tensor:
    t = torch.zeros(1, 5, 5)
    t[0, 1] = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    t[0, 3] = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.2])
    return t


def test_block_extraction_and_renormalisation_by_hand():
    t = _five_token_map()
    block = gather_block(t, torch.tensor([[1, 3]]), torch.tensor([[0, 2, 4]]))  # rows 1, 3; columns 0, 2, 4
    torch.testing.assert_close(block, torch.tensor([[[0.1, 0.3, 0.0], [0.5, 0.1, 0.2]]]))
    # renormalised: row 1 (0.1, 0.3, 0) / 0.4 = (0.25, 0.75, 0); row 3 (0.5, 0.1, 0.2) / 0.8 = (0.625, 0.125, 0.25)
    torch.testing.assert_close(renormalise(block, torch.ones(1, 2, 3, dtype=torch.bool)),
                               torch.tensor([[[0.25, 0.75, 0.0], [0.625, 0.125, 0.25]]]))
    # an index of -1 (padding) gives 0; a column left out of the set: row 3 over columns 0, 2 = (0.5, 0.1) / 0.6
    padded = gather_block(t, torch.tensor([[3, -1]]), torch.tensor([[0, 2, -1]]))
    torch.testing.assert_close(padded, torch.tensor([[[0.5, 0.1, 0.0], [0.0, 0.0, 0.0]]]))
    torch.testing.assert_close(renormalise(padded[:, :1], torch.tensor([True, True, False])),
                               torch.tensor([[[5 / 6, 1 / 6, 0.0]]]))
    # with a head dimension (B, H, L, L): each head gathered the same way
    two_heads = torch.stack([t[0], 2 * t[0]]).unsqueeze(0)
    torch.testing.assert_close(gather_block(two_heads, torch.tensor([[1]]), torch.tensor([[1, 3]])),
                               torch.tensor([[[[0.2, 0.4]], [[0.4, 0.8]]]]))


def test_kl_rows_by_hand_zero_at_equality_and_mse():
    teacher = torch.tensor([[[0.5, 0.5, 0.0]]])  # (B=1, R=1, C=3)
    allowed = torch.tensor([[[True, True, False]]])
    student = torch.tensor([[[0.25, 0.75, 0.0]]])
    kl, rows = row_divergence(teacher, student, allowed, "kl")
    # KL = 0.5 ln(0.5 / 0.25) + 0.5 ln(0.5 / 0.75) = 0.5 ln(4/3) = 0.143841
    assert float(kl) == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6) and rows.tolist() == [[True]]
    mse, _ = row_divergence(teacher, student, allowed, "mse")
    assert float(mse) == pytest.approx((0.25 ** 2 + 0.25 ** 2) / 2, abs=1e-7)  # over the 2 allowed columns
    # the student equal to the teacher's renormalised block: KL 0 (a teacher row given unnormalised: 0.2, 0.2)
    same, _ = row_divergence(torch.tensor([[[0.2, 0.2, 0.6]]]), torch.tensor([[[0.5, 0.5, 0.0]]]), allowed, "kl")
    assert float(same) == pytest.approx(0.0, abs=1e-6)
    # a row with a single allowed column is left out; masked_mean averages the kept rows only
    per_row, kept = row_divergence(torch.ones(1, 2, 2) / 2, torch.tensor([[[1.0, 0.0], [0.25, 0.75]]]),
                                   torch.tensor([[[True, False], [True, True]]]), "kl")
    assert kept.tolist() == [[False, True]]
    assert float(masked_mean(per_row, kept)) == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)


def test_causal_renormalisation_of_a_uniform_teacher_row_is_uniform_causal():
    valid = torch.ones(1, 5, dtype=torch.bool)
    allowed = causal_allowed(valid)  # j <= i
    uniform = torch.full((1, 5, 5), 0.2)
    got = renormalise(uniform, allowed)
    want = torch.tril(torch.ones(5, 5)) / torch.arange(1, 6).unsqueeze(1)  # row i: 1 / (i + 1) on j <= i
    torch.testing.assert_close(got[0], want)
    # the student's uniform causal attention then matches it exactly: KL 0 on rows 1..4 (row 0 has one column)
    per_row, kept = row_divergence(uniform, want.unsqueeze(0), allowed, "kl")
    assert kept.tolist() == [[False, True, True, True, True]]
    assert float(masked_mean(per_row, kept)) == pytest.approx(0.0, abs=1e-6)
    # padding (a left-padded row): the pad column is never allowed
    left_padded = causal_allowed(torch.tensor([[False, True, True]]))
    assert left_padded[0].tolist() == [[False, False, False], [False, True, False], [False, True, True]]


def test_virtual_attention_equals_a_manual_softmax_with_gqa():
    torch.manual_seed(0)
    heads, kv, d = 4, 2, 3
    q, k = torch.randn(1, 2, heads * d), torch.randn(1, 3, kv * d)
    cols = torch.tensor([[True, False, True]])
    got = virtual_attention(q, k, cols, num_heads=heads, num_kv_heads=kv, head_dim=d)  # (1, 4, 2, 3)
    for h in range(heads):
        g = h // (heads // kv)  # query heads 0, 1 share kv head 0; 2, 3 share kv head 1
        qh, kh = q[0, :, h * d : (h + 1) * d], k[0, :, g * d : (g + 1) * d]
        logits = qh @ kh.T / math.sqrt(d)  # (2, 3)
        want = torch.softmax(logits[:, [0, 2]], -1)
        torch.testing.assert_close(got[0, h][:, [0, 2]], want)
        assert torch.equal(got[0, h][:, 1], torch.zeros(2))  # the masked column
    assert torch.equal(virtual_attention(q, k, torch.zeros(1, 3, dtype=torch.bool), num_heads=heads,
                                         num_kv_heads=kv, head_dim=d), torch.zeros(1, 4, 2, 3))


def test_hooked_q_k_with_rope_reproduce_the_models_own_last_row(tiny_model):
    """q / k from the hooks, rotated with the row's own positions, give the eager kernel's EOS row exactly: the
    hooks, the GQA repetition, the scaling and the RoPE reading are the model's own."""
    from credo.methods.reward_models.idrm.student import capture, eager_attention, head_shape, rotate
    from credo.models import ValueModel
    from credo.rewards.rm_scoring import response_batch, rm_scores

    model, tok = tiny_model
    rm = ValueModel.from_policy(model)
    batch = response_batch(tok, ["rev abc=", "rev hgfedc="], ["cba", "cdefgh"])
    heads, kv, d = head_shape(rm.backbone)
    assert (heads, kv, d) == (4, 2, 8)
    with eager_attention(rm.backbone), torch.no_grad():
        with capture(rm.backbone, [1]) as cap:
            rm_scores(rm, batch)
        cos, sin = rm.backbone.rotary_emb(cap.q[1], batch.position_ids)
    assert rm.backbone.config._attn_implementation == "sdpa"  # switched back after the block
    q, k = rotate(cap.q[1], cos, sin, heads, d), rotate(cap.k[1], cos, sin, kv, d)
    valid = batch.attention_mask.bool()
    virt = virtual_attention(q, k, valid, num_heads=heads, num_kv_heads=kv, head_dim=d)  # (2, H, L, L)
    eos = valid.shape[1] - 1 - valid.flip(-1).long().argmax(-1)
    for b in range(2):
        torch.testing.assert_close(virt[b, :, eos[b]], cap.attn[1][b, :, eos[b]], rtol=1e-4, atol=1e-5)


def test_eager_is_required_and_the_inference_path_is_unchanged(tiny_model):
    from credo.methods.reward_models.idrm.student import capture, eager_attention
    from credo.models import ValueModel
    from credo.rewards.rm_scoring import response_batch, rm_scores

    model, tok = tiny_model
    rm = ValueModel.from_policy(model)
    batch = response_batch(tok, ["rev abc=", "rev hgfedc="], ["cba", "cdefghxx"])
    with pytest.raises(ConfigError, match="eager"):  # credo's default sdpa returns no maps
        with capture(rm.backbone, [1]):
            pass
    with torch.no_grad():
        plain = rm_scores(rm, batch)
        with eager_attention(rm.backbone), capture(rm.backbone, [0, 1]) as cap:
            hooked = rm_scores(rm, batch)
    assert plain.shape == hooked.shape == (2,)
    torch.testing.assert_close(hooked, plain, rtol=1e-5, atol=1e-6)  # the same scalar head at EOS
    width = batch.input_ids.shape[1]
    assert cap.attn[1].shape == (2, 4, width, width) and cap.q[1].shape == (2, width, 32) and \
        cap.k[1].shape == (2, width, 16)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(cap.attn[1].sum(-1).transpose(1, 2)[real], torch.ones(int(real.sum()), 4))


def test_teacher_layout_shapes_alignment_and_save_load(tmp_path):
    from credo.methods.reward_models.idrm.teacher import CrossEncoder, build_teacher, encode_pairs, student_positions
    from credo.models import build_char_tokenizer
    from credo.rewards.rm_scoring import response_batch

    tok = build_char_tokenizer()
    tb = encode_pairs(tok, ["ab"], ["ba"], ["bbb"])  # [CLS] a b [SEP] b a [SEP] b b b [SEP]
    cls_id, sep = len(tok), len(tok) + 1
    a, b = tok.convert_tokens_to_ids(["a", "b"])
    assert tb.input_ids[0].tolist() == [cls_id, a, b, sep, b, a, sep, b, b, b, sep]
    assert tb.token_type_ids[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert (tb.first_start, tb.second_start) == ([4], [7])
    teacher = build_teacher(tok)
    assert teacher.bert.config.vocab_size == len(tok) + 2 and teacher.bert.config._attn_implementation == "eager"
    logits, maps = teacher(tb, output_attentions=True)
    assert logits.shape == (1,) and len(maps) == 2 and maps[0].shape == (1, 4, 11, 11)
    # student rows <bos> a b b a <eos> and <bos> a b b b b <eos> mapped onto the teacher row
    sb = response_batch(tok, ["ab", "ab"], ["ba", "bbb"])
    pos = student_positions(sb.prompt_len, sb.input_ids.shape[1], [3, 3], [3, 4], [4, 7])
    assert pos.tolist() == [[0, 1, 2, 4, 5, 6, -1], [0, 1, 2, 7, 8, 9, 10]]
    for r in range(2):  # every character sits on the same character; <bos> on [CLS], <eos> on its [SEP]
        cols = pos[r] >= 0
        got = tb.input_ids[0][pos[r][cols]].tolist()
        want = sb.input_ids[r][cols].tolist()
        assert got[1:-1] == want[1:-1] and got[0] == cls_id and got[-1] == sep and want[-1] == tok.eos_token_id
    teacher.save(tmp_path / "t")
    again = CrossEncoder.load(tmp_path / "t")
    torch.testing.assert_close(again(tb)[0], logits)
    with pytest.raises(FileNotFoundError, match="not a saved idrm teacher"):
        CrossEncoder.load(tmp_path)


def test_a_bpe_tokenizer_is_refused():
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    from credo.methods.reward_models.idrm.teacher import check_char_tokenizer
    from credo.models import build_char_tokenizer

    check_char_tokenizer(build_char_tokenizer())
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "ab": 1}, "<unk>")))
    with pytest.raises(ConfigError, match="character tokenizer"):
        check_char_tokenizer(other)


def test_layer_mapping_attention_mass_and_corruption_kinds():
    from credo.methods.reward_models.idrm.evaluate import by_kind, corruption_kind

    assert layer_pairs("last", 2, 2) == [(1, 1)]
    assert layer_pairs("uniform", 4, 2) == [(0, 0), (1, 0), (2, 1), (3, 1)]  # round(0.5) = 0 -> at least layer 1
    assert layer_pairs("uniform", 2, 4) == [(0, 1), (1, 3)]
    # 10 real tokens (one left pad): fifths of 2 tokens each; row weights 0.1 each except 0.2 at the last token
    row = torch.tensor([[0.0] + [0.1] * 8 + [0.0, 0.2]])  # 11 columns, the 10th real token carries 0.0
    valid = torch.tensor([[False] + [True] * 10])
    torch.testing.assert_close(attention_mass_fifths(row, valid), torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.2]]))
    assert [corruption_kind("abcd", r) for r in ("abc", "abcde", "abdc", "abcc")] == ["drop", "add", "swap",
                                                                                    "replace"]
    pairs = [PreferencePair("p", "abc", "acb"), PreferencePair("p", "abc", "abb"), PreferencePair("p", "abc", "ab")]
    assert by_kind(pairs, [1.0, 0.0, 1.0]) == {"drop": 1.0, "replace": 0.0, "same_length": 0.5, "swap": 1.0}


def test_teacher_is_frozen_and_only_the_student_learns(tiny_model):
    from credo.methods.reward_models.idrm.config import IDRMConfig
    from credo.methods.reward_models.idrm.student import eager_attention
    from credo.methods.reward_models.idrm.teacher import build_teacher
    from credo.methods.reward_models.idrm.train import train_idrm
    from credo.models import ValueModel

    model, tok = tiny_model
    rm = ValueModel.from_policy(model)
    teacher = build_teacher(tok, hidden=16, heads=4, intermediate=32)
    before_t = [p.detach().clone() for p in teacher.parameters()]
    before_s = [p.detach().clone() for p in rm.backbone.parameters()]
    pairs = [PreferencePair("rev abc=", "cba", "cab"), PreferencePair("rev hgfe=", "efgh", "efg")]
    seen = []
    variants = [dict(teacher_orders="both", inter_rope="own_positions", layers="uniform"),
                dict(heads="per_head", intra_rows="last", align_loss="mse"), {}]
    for v in variants:
        cfg = IDRMConfig(**v)
        with eager_attention(rm.backbone):
            train_idrm(rm, teacher, tok, pairs, cfg, steps=1, batch_size=2, lr=1e-2,
                       on_step=lambda s, m: seen.append(m))
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before_t, teacher.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(before_s, rm.backbone.parameters()))
    for m in seen:
        assert m["idrm/intra_kl"] > 0 and m["idrm/inter_kl"] > 0
        # loss = BT + 1.0 * intra + 1.0 * inter (the defaults)
        assert m["rm/loss"] == pytest.approx(m["idrm/bt_loss"] + m["idrm/intra_kl"] + m["idrm/inter_kl"], rel=1e-5)
    with pytest.raises(ConfigError, match="eager"):  # outside eager_attention: refused
        train_idrm(rm, teacher, tok, pairs, IDRMConfig(), steps=1, batch_size=2, lr=1e-2)


IDRM_RUN = ["rm.method=idrm", "rm.pairs=32", "rm.eval_pairs=8", "rm.steps=2", "rm.batch_size=4", "rm.eval_every=1",
            "log.tensorboard=false", "log.progress=false", "warm_start.steps=1", "model.hidden_size=32",
            "model.intermediate_size=64", "idrm.teacher_steps=2", "idrm.teacher_hidden=16",
            "idrm.teacher_intermediate=32"]


def test_rm_train_idrm_through_the_cli(tmp_path):
    from credo.cli.main import main
    from credo.models import ValueModel

    run = tmp_path / "idrm"
    assert main(["-q", "rm", "train", "--run-dir", str(run), *IDRM_RUN, "idrm.min_teacher_acc=0"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["teacher/acc"] <= 1.0 and 0.0 <= summary["final/eval/pairwise_acc"] <= 1.0
    assert summary["final/idrm/attn_mass_q1"] + summary["final/idrm/attn_mass_q5"] <= 1.0 + 1e-6
    assert sum(summary[f"final/idrm/attn_mass_q{i}"] for i in range(1, 6)) == pytest.approx(1.0, abs=1e-4)
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval/pairwise_acc" in r] == [0, 1, 2]
    assert all(r["idrm/intra_kl"] > 0 and r["idrm/inter_kl"] > 0 for r in rows if "rm/loss" in r)
    rm = ValueModel.load(run / "reward_model")  # the student, saved with the configured (sdpa) kernel
    assert rm.backbone.config._attn_implementation == "sdpa"
    # a saved teacher is loaded instead of trained; the long method name is the same method
    again = tmp_path / "again"
    assert main(["-q", "rm", "train", "--run-dir", str(again), *IDRM_RUN, "rm.method=interaction_distillation",
                 f"idrm.teacher={run / 'teacher'}", "idrm.min_teacher_acc=0"]) == 0
    assert json.loads((again / "summary.json").read_text())["teacher/acc"] == summary["teacher/acc"]
    assert not (again / "teacher").exists()
    # the gate: a teacher below idrm.min_teacher_acc stops the run; the implicit model is refused
    assert main(["-q", "rm", "train", "--run-dir", str(tmp_path / "gate"), *IDRM_RUN, "idrm.min_teacher_acc=1"]) == 1
    imp = tmp_path / "imp"
    assert main(["-q", "rm", "train", "--run-dir", str(imp), *IDRM_RUN, "rm.model=implicit"]) == 2  # a config error
    assert main(["-q", "rm", "train", "--run-dir", str(tmp_path / "heads"), *IDRM_RUN, "idrm.heads=per_head",
                 "idrm.teacher_heads=2", "idrm.min_teacher_acc=0"]) == 2  # 4 student heads against 2
