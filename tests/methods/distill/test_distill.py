"""On-policy distillation (credo.algo.distill, credo.methods.distill): the terms by hand, the teacher's checks, and
runs through the CLI (teacher == student, each mode, resume)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from credo.algo import compute_policy_loss
from credo.algo.aggregation import agg_loss
from credo.algo.distill import distill_advantages, distill_loss_tokens, distill_token_rewards, reverse_kl_tokens
from credo.cli.main import main
from credo.config import ConfigError, load_config
from credo.methods.distill.teacher import check_same_vocab, load_teacher
from credo.models import build_model, save_model
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY, TINY_PRETRAINED, TINY_RUN

S = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])  # student log-probs (B=2, T=3)
Q = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -9.0, -7.0]])  # teacher log-probs
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 1's last position is padding


def test_reverse_kl_tokens_by_hand():
    # s - q: row 0: -1+1.5=0.5, -2+1=-1, -0.5+0.5=0; row 1: -0.1+0.2=0.1, -3+9=6, masked -> 0
    expected = torch.tensor([[0.5, -1.0, 0.0], [0.1, 6.0, 0.0]])
    assert torch.allclose(reverse_kl_tokens(S, Q, MASK), expected)


def test_dense_token_rewards_by_hand():
    scores = torch.tensor([1.0, 0.0])
    out = distill_token_rewards(scores, S, Q, MASK, coef=0.5, reward_weight=2.0)
    # w * score on the last loss token (row 0: t=2, row 1: t=1) minus c * (s - q):
    # row 0: [-0.25, 0.5, 2*1 - 0] ; row 1: [-0.05, 0 - 3, 0]
    assert torch.allclose(out, torch.tensor([[-0.25, 0.5, 2.0], [-0.05, -3.0, 0.0]]))
    # reward_weight 0 = pure distillation: only -c (s - q)
    pure = distill_token_rewards(scores, S, Q, MASK, coef=1.0, reward_weight=0.0)
    assert torch.allclose(pure, -reverse_kl_tokens(S, Q, MASK))


def test_advantage_mode_by_hand():
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    out = distill_advantages(adv, S, Q, MASK, coef=1.0, reward_weight=0.5)
    # 0.5 * A - (s - q): row 0: [0.5-0.5, 0.5+1, 0.5-0] ; row 1: [-1-0.1, -1-6, masked 0]
    assert torch.allclose(out, torch.tensor([[0.0, 1.5, 0.5], [-1.1, -7.0, 0.0]]))


def test_loss_terms_k1_k2_k3_by_hand_and_their_gradients():
    lp = S.clone().requires_grad_(True)
    k2 = distill_loss_tokens(lp, Q, "k2")
    # k2 = (s - q)^2 / 2: row 0: [0.125, 0.5, 0]; gradient d/ds = s - q
    assert torch.allclose(k2[0], torch.tensor([0.125, 0.5, 0.0]))
    (k2 * MASK).sum().backward()
    assert torch.allclose(lp.grad, reverse_kl_tokens(S, Q, MASK))
    k1 = distill_loss_tokens(S, Q, "k1")
    assert torch.allclose(k1[0], torch.tensor([0.5, -1.0, 0.0]))
    # k3 with u = q - s = -0.5 at (0, 0): e^-0.5 + 0.5 - 1 = 0.60653 - 0.5 = 0.10653
    assert distill_loss_tokens(S, Q, "k3")[0, 0].item() == pytest.approx(0.1065307, abs=1e-6)
    q = Q.clone().requires_grad_(True)  # the teacher is a constant
    distill_loss_tokens(S.clone().requires_grad_(True), q, "k2").sum().backward()
    assert q.grad is None


def test_advantage_mode_has_the_k2_loss_gradient_at_ratio_one():
    """PPO with A = -(s - q) at ratio 1 (no clipping active) and loss mode k2 give the same gradient."""
    lp = S.clone().requires_grad_(True)
    adv = distill_advantages(torch.zeros_like(S), S, Q, MASK, coef=1.0, reward_weight=1.0)
    compute_policy_loss("ppo", logprobs=lp, old_logprobs=S, advantages=adv, response_mask=MASK).loss.backward()
    g_adv = lp.grad.clone()
    lp.grad = None
    agg_loss(distill_loss_tokens(lp, Q, "k2"), MASK, "token-mean").backward()
    # both: (s - q) / 5 loss tokens on each token
    assert torch.allclose(g_adv, lp.grad)
    assert torch.allclose(lp.grad, reverse_kl_tokens(S, Q, MASK) / 5)


# ----------------------------------------------------------------------------- the teacher

def _save(tmp_path: Path, name: str, seed: int, *, extra_token: str | None = None) -> Path:
    model, tok = build_model(TINY, seed=seed)
    if extra_token:
        tok.add_tokens([extra_token])
    save_model(model, tok, tmp_path / name)
    return tmp_path / name


def test_teacher_with_another_vocabulary_is_refused(tmp_path: Path):
    good, bad = _save(tmp_path, "good", 1), _save(tmp_path, "bad", 1, extra_token="<zz>")
    _, student_tok = build_model(TINY, seed=0)
    cfg = load_config(None, [f"distill.teacher.path={bad}"])
    with pytest.raises(ConfigError, match="teacher's tokenizer differs from the student's .1 tokens differ"):
        load_teacher(cfg, student_tok)
    teacher = load_teacher(load_config(None, [f"distill.teacher.path={good}"]), student_tok)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())

    class Tok:  # same size, one id swapped
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    with pytest.raises(ConfigError, match="2 tokens differ"):
        check_same_vocab(Tok({"a": 0, "b": 1}), Tok({"a": 1, "b": 0}), "x")


def test_config_needs_one_teacher_and_a_server_teacher_must_answer():
    with pytest.raises(ConfigError, match="exactly one of distill.teacher.path"):
        load_config(None, ["distill.mode=loss"])
    with pytest.raises(ConfigError, match="distill.estimator"):
        load_config(None, ["distill.teacher.path=x", "distill.estimator=k9"])
    cfg = load_config(None, ["distill.teacher.url=http://127.0.0.1:1"])  # served: tests/rollout/test_vllm_scoring.py
    with pytest.raises(ConfigError, match="cannot reach a vLLM server"):
        load_teacher(cfg, None)
    assert load_config(None, []).distill is None


# ----------------------------------------------------------------------------- through the CLI

QUIET_DISTILL = ["log.progress=false", "log.report=false", "eval.every=0"]
TINY_DISTILL = [*TINY_RUN, *QUIET_DISTILL]


def test_teacher_equal_to_student_gives_zero_kl_and_the_grpo_update(tmp_path: Path):
    """Reward mode, reward_weight 1, the teacher the student's own starting weights: after one step the reverse KL
    is exactly 0 and the trained weights equal plain GRPO's (with the old-log-prob pass that distillation keeps)."""
    init = _save(tmp_path, "init", 0)
    common = [*TINY_PRETRAINED, *QUIET_DISTILL, f"model.path={init}", "warm_start.enabled=false", "train.steps=1", "train.warmup_steps=0",
              "reward.name=tests.reward_fixtures:length_score"]  # rewards that vary within a group: a real update
    assert main(["-q", "train", "--run-dir", str(tmp_path / "grpo"), *common, "train.old_logprob_pass=always"]) == 0
    assert main(["-q", "train", "--run-dir", str(tmp_path / "d"), *common, f"distill.teacher.path={init}",
                 "distill.mode=reward", "distill.reward_weight=1", "distill.coef=1"]) == 0
    row = read_metrics(tmp_path / "d" / "metrics.jsonl")[1]
    assert row["distill/reverse_kl"] == 0.0 and row["timing_s/teacher"] > 0
    assert row["distill/teacher_logprob"] == row["distill/student_logprob"] < 0
    a, b = (load_file(tmp_path / r / "final" / "model.safetensors") for r in ("grpo", "d"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(init / "model.safetensors")
    assert sum(not torch.equal(a[k], start[k]) for k in a) > len(a) // 2  # the step moved most tensors


@pytest.mark.parametrize("mode", ["advantage", "loss"])
def test_each_mode_runs_with_its_metrics_and_keeps_the_teacher_out_of_checkpoints(tmp_path: Path, mode: str):
    teacher = _save(tmp_path, "teacher", 7)
    run = tmp_path / "run"
    assert main(["-q", "train", "--run-dir", str(run), *TINY_DISTILL, "train.steps=2", "checkpoint.every=1",
                 f"distill.teacher.path={teacher}", f"distill.mode={mode}", "distill.reward_weight=0"]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    for r in rows[1:]:
        assert r["distill/reverse_kl"] != 0 and r["distill/teacher_logprob"] < 0 and "timing_s/teacher" in r
        # reward_weight 0: the advantages are the reverse KL alone (advantage mode) or zero (loss mode)
        assert (r["distill/advantage_mean"] == 0.0) == (mode == "loss")
        assert ("distill/kl_loss" in r) == (mode == "loss")
    names = {p.name for p in (run / "checkpoints").rglob("*")}
    assert "teacher" not in names and not any("teacher" in n for n in names)


@pytest.mark.parametrize("mode", ["reward", "advantage", "loss"])
def test_coef_zero_equals_grpo_with_any_teacher(tmp_path: Path, mode: str):
    """issue 37's cross-mode equivalence: distill.coef=0 with a teacher unlike the student (another seed) trains
    exactly what plain GRPO trains (with the old-log-prob pass distillation keeps): the same metrics rows (bar the
    distill/ diagnostics and timings) and bit-equal final weights. It catches a KL term that leaks in at coef 0,
    a mode that rescales rewards or advantages by itself, or the teacher pass touching the student or the RNG.
    Loss mode failed it until its term was dropped at coef 0: the zero-weighted term kept the zero-advantage rows
    (actor/skipped_rows_frac 0.0 vs 0.25, final weights 1.2e-7 apart)."""
    init, teacher = _save(tmp_path, "init", 0), _save(tmp_path, "teacher", 7)
    common = [*TINY_PRETRAINED, *QUIET_DISTILL, f"model.path={init}", "warm_start.enabled=false", "train.steps=2", "train.warmup_steps=0",
              "reward.name=tests.reward_fixtures:length_score", "log.tensorboard=false"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "grpo"), *common, "train.old_logprob_pass=always"]) == 0
    assert main(["-q", "train", "--run-dir", str(tmp_path / "d"), *common, f"distill.teacher.path={teacher}",
                 f"distill.mode={mode}", "distill.reward_weight=1", "distill.coef=0"]) == 0

    def rows(run: str) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/", "distill/"))}
                for r in read_metrics(tmp_path / run / "metrics.jsonl") if "reward/mean" in r]

    d_rows = [r for r in read_metrics(tmp_path / "d" / "metrics.jsonl") if "reward/mean" in r]
    assert len(d_rows) == 2 and all(r["distill/reverse_kl"] != 0.0 for r in d_rows)  # the teacher really differs
    assert rows("grpo") == rows("d")
    a, b = (load_file(tmp_path / r / "final" / "model.safetensors") for r in ("grpo", "d"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
