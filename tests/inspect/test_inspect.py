"""The credit-assignment inspector (credo.inspect, ``credo inspect``): gradient weights by hand, clip regions,
disagreement counts, the CLI after a tiny run (escaped page, JSON), format-1 dumps."""
from __future__ import annotations

import html
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from credo.cli.main import main
from credo.inspect.core import inspect_run
from credo.inspect.methods import EstimatorReplay, disagreements, replay_estimator, replay_loss
from credo.inspect.page import _show
from credo.inspect.replay import DTYPE, ReplayBatch
from tests.conftest import TINY_RUN

E = math.e


def _batch(delta: list[list[float]], *, mask: list[list[int]] | None = None, groups: list[int] | None = None,
           scores: list[float] | None = None) -> ReplayBatch:
    """Rows with old log-probs -1 and log-probs -1 + delta (ratio e^delta)."""
    d = torch.tensor(delta, dtype=DTYPE)
    b, t = d.shape
    m = torch.ones(b, t, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    old = torch.full((b, t), -1.0, dtype=DTYPE)
    rows = [{"uid": f"u{i}", "response_ids": list(range(t)), "prompt": "p"} for i in range(b)]
    return ReplayBatch(step=1, rows=rows, tokens=[[str(j) for j in range(t)] for _ in range(b)], mask=m,
                       scores=torch.tensor(scores or [0.0] * b, dtype=DTYPE),
                       group_ids=torch.tensor(groups or list(range(b))), logprobs=old + d, old_logprobs=old,
                       rollout_logprobs=old)


# one row, six tokens: (A, log-ratio delta)
ADV = [[1.0, 1.0, -1.0, -1.0, -1.0, 2.0]]
DELTA = [[0.1, 0.5, -0.5, 0.1, 1.5, -0.5]]


def test_ppo_gradient_weights_by_hand():
    batch = _batch(DELTA)
    rep = replay_loss("ppo", {}, batch, torch.tensor(ADV, dtype=DTYPE), agg="token-mean", loss_scale_factor=None)
    r = [math.exp(x) for x in DELTA[0]]
    expected = [
        -1.0 * r[0],  # A=+1, r=e^0.1=1.105 in [0.8, 1.2]: L = -A r, dL/dlp = -A r = -1.105
        0.0,          # A=+1, r=e^0.5=1.649 > 1.2: L = -A 1.2, constant: 0
        0.0,          # A=-1, r=e^-0.5=0.607 < 0.8: L = -A 0.8, constant: 0
        1.0 * r[3],   # A=-1, r=1.105: max(r, clip(r)) = r, min(r, 3) = r: dL/dlp = -A r = +1.105
        0.0,          # A=-1, r=e^1.5=4.48 > clip_c 3: dual clip L = -A 3, constant: 0
        -2.0 * r[5],  # A=+2, r=0.607 < 0.8 but A > 0: max(-2r, -1.6) = -2r (-1.213 > -1.6): -2 r = -1.213
    ]
    assert rep.grad[0].tolist() == pytest.approx(expected, abs=1e-12)
    # the spec's weight w = -grad / A: r, 0, 0, r, 0, r
    assert rep.weight[0].tolist() == pytest.approx([r[0], 0.0, 0.0, r[3], 0.0, r[5]], abs=1e-12)
    # token-mean over 6 tokens: the aggregated gradient is grad / 6
    assert rep.agg_grad[0].tolist() == pytest.approx([g / 6 for g in expected], abs=1e-12)
    assert rep.regions[0] == ["in-range", "clip-high", "clip-low", "in-range", "dual-clip", "in-range"]


def test_gppo_keeps_a_bounded_gradient_where_ppo_has_none():
    batch = _batch(DELTA)
    rep = replay_loss("gppo", {}, batch, torch.tensor(ADV, dtype=DTYPE), agg="token-mean", loss_scale_factor=None)
    # gppo clip_high 0.28: token 1 (A=+1, r=1.649 > 1.28) keeps weight 1 + 0.28: grad = -1 * 1.28;
    # token 2 (A=-1, r=0.607 < 0.8) keeps weight 0.8: grad = -(-1) * 0.8 = +0.8; token 4 (r=4.48 < clip_c 10) is
    # not dual-clipped: grad = -A r = +4.4817
    assert rep.grad[0, 1].item() == pytest.approx(-1.28, abs=1e-12)
    assert rep.grad[0, 2].item() == pytest.approx(0.8, abs=1e-12)
    assert rep.grad[0, 4].item() == pytest.approx(E ** 1.5, abs=1e-12)
    assert rep.regions[0][:3] == ["in-range", "clip-high", "clip-low"]


def test_region_labels_masked_zero_advantage_and_loss_specific_readings():
    batch = _batch([[0.1, 0.1, 0.5, 0.0]], mask=[[1, 1, 1, 0]])
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=DTYPE)
    ppo = replay_loss("ppo", {}, batch, adv, agg="token-mean", loss_scale_factor=None)
    assert ppo.regions[0] == ["zero-adv", "in-range", "clip-high", "masked"]
    assert ppo.grad[0, 3].item() == 0.0 and math.isnan(ppo.weight[0, 0].item())
    # dppo_tv (0.15 / 0.15): token 2 has p - p_old = e^-0.5 - e^-1 = 0.6065 - 0.3679 = 0.239 > 0.15 and A > 0:
    # outside the trust region, weight 0; token 1: e^-0.9 - e^-1 = 0.0387 <= 0.15: inside, w = r = e^0.1
    dppo = replay_loss("dppo_tv", {}, batch, adv, agg="token-mean", loss_scale_factor=None)
    assert dppo.regions[0][1:3] == ["in-range", "outside-trust"]
    assert dppo.weight[0, 1].item() == pytest.approx(E ** 0.1, abs=1e-12) and dppo.grad[0, 2].item() == 0.0
    # bypass_mode returns no token metrics: the generic reading uses its clip_high 0.2 on the ratio
    bypass = replay_loss("bypass_mode", {}, batch, adv, agg="token-mean", loss_scale_factor=None)
    assert bypass.regions[0][1:3] == ["in-range", "clip-high"]
    # gspo returns no clipfrac_high: its sequence ratio exp((0.1 + 0.1 + 0.5) / 3) = e^0.2333 = 1.263 > 1 + 4e-4 with
    # A > 0: both A > 0 tokens are clip-high with gradient 0
    gspo = replay_loss("gspo", {}, batch, adv, agg="token-mean", loss_scale_factor=None)
    assert gspo.regions[0] == ["zero-adv", "clip-high", "clip-high", "masked"] and gspo.grad.abs().sum() == 0


def test_disagreement_between_losses_and_estimators():
    # ppo vs gppo on the six tokens above: ppo has grad 0 on tokens 1, 2, 4; gppo non-zero on 1, 2 (preserved)
    # and on 4 (clip_c 10 > 4.48): 3 of 6 tokens are zero vs non-zero; no opposite signs
    batch = _batch(DELTA)
    adv = torch.tensor(ADV, dtype=DTYPE)
    reps = [replay_loss(n, {}, batch, adv, agg="token-mean", loss_scale_factor=None) for n in ("ppo", "gppo")]
    # constructed estimators: a = [1, -1, 0, 2, 0, 1], b = [1, 1, 0, 0, 0, 3]: token 1 opposite signs (1/6),
    # token 3 zero vs non-zero (1/6); |a - b| = 0 + 2 + 0 + 2 + 0 + 2 = 6 -> mean 1.0
    ests = [EstimatorReplay("a", {}, torch.tensor([[1.0, -1, 0, 2, 0, 1]], dtype=DTYPE)),
            EstimatorReplay("b", {}, torch.tensor([[1.0, 1, 0, 0, 0, 3]], dtype=DTYPE))]
    rows, loss_flag, est_flag = disagreements(reps, ests, batch.mask)
    by_kind = {r.kind: r for r in rows}
    assert (by_kind["loss"].sign, by_kind["loss"].zero) == (0.0, pytest.approx(3 / 6))
    assert (by_kind["estimator"].sign, by_kind["estimator"].zero) == (pytest.approx(1 / 6), pytest.approx(1 / 6))
    assert by_kind["estimator"].mean_abs_diff == pytest.approx(1.0)
    assert loss_flag[0].tolist() == [False, True, True, False, True, False]
    assert est_flag[0].tolist() == [False, True, False, True, False, False]


def test_estimators_on_a_group_and_a_skipped_one():
    # one group of four, rewards [1, 0, 0, 0], two tokens each. grpo: mean 0.25, unbiased std
    # sqrt((0.75^2 + 3 * 0.25^2) / 3) = sqrt(0.25) = 0.5 -> A = 0.75 / 0.5 = 1.5 and -0.25 / 0.5 = -0.5 (eps 1e-6
    # ignored at 1e-5); rloo: r_i - mean of the others = 1 - 0 = 1 and 0 - 1/3 = -0.3333
    batch = _batch([[0.0, 0.0]] * 4, groups=[0, 0, 0, 0], scores=[1.0, 0.0, 0.0, 0.0])
    grpo = replay_estimator("grpo", {}, batch).advantages
    rloo = replay_estimator("rloo", {}, batch).advantages
    assert grpo[:, 0].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert rloo[:, 1].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=1e-9)
    rows, _, _ = disagreements([], [EstimatorReplay("grpo", {}, grpo), EstimatorReplay("rloo", {}, rloo)],
                               batch.mask)
    # same signs everywhere; |diff| 0.5 on row 0 and 0.5 - 1/3 = 1/6 on rows 1-3 -> mean (0.5 + 3/6) / 4 = 0.25
    assert rows[0].sign == 0.0 and rows[0].mean_abs_diff == pytest.approx(0.25, abs=1e-5)
    with pytest.raises(ValueError, match="needs values"):
        replay_estimator("gae", {}, batch)
    # with dumped critic values gae runs: gamma = lam = 1, no whitening, score 1 on the last token, V = [0.5, 0.25]:
    # delta_1 = 1 + 0 - 0.25 = 0.75, delta_0 = 0 + 0.25 - 0.5 = -0.25; A_1 = 0.75, A_0 = -0.25 + 0.75 = 0.5
    batch.values = torch.tensor([[0.5, 0.25]] * 4, dtype=DTYPE)
    gae = replay_estimator("gae", {"whiten": False}, batch).advantages
    assert gae[0].tolist() == pytest.approx([0.5, 0.75], abs=1e-12)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("inspect") / "run"
    assert main(["-q", "train", "--run-dir", str(run), *TINY_RUN, "train.steps=2", "log.rollouts_every=1",
                 "log.progress=false", "log.report=false", "log.tensorboard=false", "eval.every=0"]) == 0
    return run


def _inject_script_row(run: Path) -> str:
    """Append a step-2 row whose prompt, uid and response tokens spell HTML; returns the response text."""
    from credo.models.build import load_tokenizer

    tok = load_tokenizer(run / "final")
    text = "<script>x"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # the character tokenizer: one token per character
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    row = dict(next(r for r in rows if r["step"] == 2))
    n = len(ids)
    row.update(uid="<img src=x onerror=alert(1)>", prompt="<script>alert(1)</script>", response=text,
               response_ids=ids, response_mask=[1] * n, advantages=[0.5] * n, rollout_logprobs=[-4.0] * n,
               old_logprobs=None, entropy=None, token_rewards=[0.0] * n)
    with (run / "rollouts.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    return text


def test_cli_inspect_after_a_tiny_run_writes_an_escaped_page_and_json(tiny_run: Path, capsys):
    rows = [json.loads(line) for line in (tiny_run / "rollouts.jsonl").read_text().splitlines()]
    assert rows[0]["format"] == 2 and len(rows[0]["rollout_logprobs"]) == len(rows[0]["response_ids"])
    assert {r["step"] for r in rows} == {1, 2}
    _inject_script_row(tiny_run)
    assert main(["inspect", str(tiny_run), "--step", "2", "--losses", "ppo,gppo,gmpo", "--estimators", "grpo,rloo,gae"]
                ) == 0
    out = tiny_run / "inspect" / "step_2.html"  # the default output
    page = out.read_text()
    assert "<script" not in page.lower() and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert '>&lt;</span>' in page  # the "<" token as an escaped cell
    from credo.models.build import load_tokenizer

    tok = load_tokenizer(tiny_run / "final")
    for t in rows[-1]["response_ids"]:  # a real sample of step 2: each token as an escaped cell
        assert f">{html.escape(_show(tok.decode([t])))}</span>" in page
    assert "needs values" in page  # gae skipped with its reason
    printed = capsys.readouterr().out
    assert str(out) in printed and "skipped estimator gae: needs values" in printed
    assert main(["inspect", str(tiny_run), "--step", "2", "--format", "json", "--out", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step"] == 2 and [x["name"] for x in doc["losses"]] == ["ppo"]  # the run's loss by default
    assert doc["sources"]["logprobs"] == "recomputed with checkpoints/step_000002/model"
    sample = doc["samples"][-1]
    assert sample["tokens"] == list("<script>x") and sample["advantages"]["run"] == [0.5] * 9
    assert len(sample["losses"]["ppo"]["grad"]) == 9 and all(g is not None for g in sample["losses"]["ppo"]["grad"])


def test_cli_inspect_errors_are_one_line(tiny_run: Path, tmp_path: Path, capsys):
    assert main(["inspect", str(tmp_path / "nope"), "--step", "1"]) == 1
    assert main(["inspect", str(tiny_run), "--step", "7"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not a directory" in err[0] and "no rows of step 7 (dumped steps: 1, 2" in err[1]
    assert main(["inspect", str(tiny_run), "--step", "1", "--losses", "ppp"]) == 2
    assert "did you mean 'ppo'" in capsys.readouterr().err


def test_a_format_1_dump_still_loads(tiny_run: Path, tmp_path: Path):
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(tiny_run / "config.yaml", old / "config.yaml")
    added = ("format", "rollout_logprobs", "old_logprobs", "entropy", "token_rewards", "values", "temperature")
    rows = [json.loads(line) for line in (tiny_run / "rollouts.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if k not in added} for r in rows if r["step"] == 1]
    (old / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ins = inspect_run(old, 1, losses="ppo,aspo")  # no checkpoint, no tokenizer: ratio 1, ids as tokens
    assert torch.equal(ins.batch.ratio, torch.ones_like(ins.batch.ratio))
    assert any("format-1" in n for n in ins.batch.notes) and any("ratio 1" in n for n in ins.batch.notes)
    assert ins.batch.tokens[0][0] == f"#{rows[0]['response_ids'][0]}"
    assert [s.name for s in ins.skipped] == ["aspo"] and "needs entropy" in ins.skipped[0].reason
    # with the run's checkpoint of step 2 the format-1 rows of step 2 get recomputed log-probs and entropy
    shutil.copytree(tiny_run / "checkpoints", old / "checkpoints")
    rows2 = [{k: v for k, v in json.loads(line).items() if k not in added}
             for line in (tiny_run / "rollouts.jsonl").read_text().splitlines()]
    (old / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows2 if r["step"] == 2))
    ins = inspect_run(old, 2, losses="ppo,aspo")
    assert ins.batch.sources["logprobs"].startswith("recomputed with checkpoints/step_000002")
    assert ins.batch.entropy is not None and [r.name for r in ins.losses] == ["ppo", "aspo"]
