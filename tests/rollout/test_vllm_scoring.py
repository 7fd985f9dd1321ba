"""Token scoring with vLLM (``score_ids``, vLLM's prompt_logprobs): the weight_sync guard's probe for engines without
a fingerprint, and the server teacher of on-policy distillation (``distill.teacher.url``).

The first tests need no vLLM (default run: fakes with hand-made values); the ``vllm`` ones start one in-process
engine and one server (~15 s + ~30 s on 2 CPU cores):
`cd /work/main && /work/venv-vllm/bin/python -m pytest -p no:cacheprovider -m vllm tests/rollout/test_vllm_scoring.py -x`.
"""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from credo.config import ConfigError, ModelConfig, load_config
from credo.config.schema import GuardsConfig
from credo.guards import GuardError, Guards
from credo.guards.weights import check_weight_sync, model_token_logprobs, probe_ids
from credo.methods.distill.teacher import ServerTeacher, check_server_vocab
from credo.rollout.vllm_transport import prompt_token_logprobs
from credo.types import Example, RewardResult, SamplingParams, Trajectory

DEMO = ModelConfig()  # head_dim 32: vLLM's CPU attention needs 32, 64, 80, ...


def _model(seed: int = 0, cfg: ModelConfig = DEMO):
    from credo.models import build_model

    return build_model(cfg, seed=seed)


# ----------------------------------------------------------------------------- no vLLM needed

def test_prompt_token_logprobs_reads_both_shapes_and_fills_nan_never_zero():
    ids = [5, 7, 9, 11]
    inproc = [None, {7: SimpleNamespace(logprob=-0.5)}, {3: SimpleNamespace(logprob=-1.0)}, {11: SimpleNamespace(
        logprob=-2.25)}]  # position 2 lacks the token's own entry
    out = prompt_token_logprobs(ids, inproc)
    assert math.isnan(out[0]) and out[1] == -0.5 and math.isnan(out[2]) and out[3] == -2.25
    served = [None, {"7": {"logprob": -0.5, "rank": 1}}, {"9": {"logprob": -9999.0}}]  # short list; a clamped -inf
    out = prompt_token_logprobs(ids, served)
    assert math.isnan(out[0]) and out[1] == -0.5 and out[2] == float("-inf") and math.isnan(out[3])


def test_model_token_logprobs_is_the_log_softmax_of_the_previous_position():
    model, _ = _model()
    ids = [3, 14, 15, 92, 65]
    got = model_token_logprobs(model, [ids, ids], [1, 3])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)  # (5, V)
    want = [float(lp[j - 1, ids[j]]) for j in range(1, 5)]  # token j given ids[:j]
    assert got[0] == pytest.approx(want, abs=1e-6) and got[1] == pytest.approx(want[2:], abs=1e-6)
    assert math.isnan(model_token_logprobs(model, [ids], [0])[0][0])  # j = 0 has no context


class _ProbedEngine:
    """An engine with score_ids and no fingerprint (as vLLM's): it scores with its own copy of the weights."""

    def __init__(self, model, tokenizer):
        import copy

        self.served, self.tokenizer = copy.deepcopy(model), tokenizer

    def score_ids(self, sequences, starts):
        return model_token_logprobs(self.served, sequences, starts)


def test_the_probe_passes_a_synced_engine_and_trips_on_a_stale_one():
    model, tok = _model()
    engine = _ProbedEngine(model, tok)
    guards = Guards(GuardsConfig(weight_sync="warn"))
    check_weight_sync(guards, model, engine, 1)  # same weights: d = 0 <= 1e-3
    assert guards.checks["weight_sync"] == 1 and guards.trips["weight_sync"] == 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)  # the trainer moved on, the engine did not
    check_weight_sync(guards, model, engine, 2)
    assert guards.trips["weight_sync"] == 1
    with pytest.raises(GuardError, match="probe's log-probs differ by"):
        check_weight_sync(Guards(), model, engine, 2)
    check_weight_sync(guards, model.state_dict(), engine, 3)  # a state dict cannot be probed: skipped, not counted
    assert guards.checks["weight_sync"] == 2
    assert len(probe_ids(len(tok))) == 32 and probe_ids(len(tok)) == probe_ids(len(tok))  # fixed per run


def test_probe_tolerance_follows_the_engine_dtype_unless_set():
    from credo.guards.weights import probe_tolerance

    def eng(dtype):
        return SimpleNamespace(options=SimpleNamespace(dtype=dtype))

    assert probe_tolerance(eng("float32"), None) == 1e-3 and probe_tolerance(eng("bfloat16"), None) == 1e-2
    assert probe_tolerance(eng("auto"), None) == 1e-2 and probe_tolerance(object(), None) == 1e-2  # maybe bf16
    assert probe_tolerance(eng("bfloat16"), 0.5) == 0.5


class _FakeScorer:
    """VLLMScorer's interface over a dict of per-sequence answers."""

    def __init__(self, vocab: list[str], answers=None):
        self.vocab, self.answers = vocab, answers or {}

    def detokenize(self, ids):
        return "".join(self.vocab[i] if i < len(self.vocab) else "" for i in ids)

    def score(self, sequences):
        return [self.answers[tuple(q)] for q in sequences]


class _CharTok:
    def __init__(self, vocab):
        self.vocab = vocab

    def __len__(self):
        return len(self.vocab)

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)


def test_server_vocab_check_refuses_another_mapping_or_a_smaller_vocabulary():
    student = _CharTok(list("abcd"))
    check_server_vocab(_FakeScorer(list("abcd")), student, "x")
    with pytest.raises(ConfigError, match="server's tokenizer differs"):
        check_server_vocab(_FakeScorer(list("abdc")), student, "x")  # two ids swapped
    with pytest.raises(ConfigError, match="student vocab size 4"):
        check_server_vocab(_FakeScorer(list("abc")), student, "x")  # the last id decodes to nothing there


def test_server_teacher_places_each_rows_response_scores_and_zeroes_off_the_mask():
    from credo.models.batch import collate

    trajs = [Trajectory(example=Example("p", "a"), group_id=0, prompt_ids=[1, 2], response_ids=[3, 4, 5],
                        rollout_logprobs=[-1.0] * 3, response_mask=[1, 0, 1], finish_reason="length"),
             Trajectory(example=Example("p", "a"), group_id=0, prompt_ids=[6, 7, 8], response_ids=[9],
                        rollout_logprobs=[-1.0], response_mask=[1], finish_reason="length")]
    batch = collate(trajs, [RewardResult(0.0)] * 2, pad_id=0)
    nan = float("nan")
    teacher = ServerTeacher.__new__(ServerTeacher)
    teacher.scorer = _FakeScorer([], {(1, 2, 3, 4, 5): [nan, -0.1, -0.2, -0.3, -0.4],
                                      (6, 7, 8, 9): [nan, -1.0, -2.0, -3.0]})
    got = teacher.logprobs(batch)
    # row 0: prompt length 2, so tokens 3, 4, 5 get -0.2, -0.3 (masked: 0), -0.4; row 1: token 9 gets -3, then pad
    assert torch.allclose(got, torch.tensor([[-0.2, 0.0, -0.4], [-3.0, 0.0, 0.0]]))


def test_distill_teacher_url_is_checked_at_load():
    from credo.methods.distill.teacher import load_teacher

    with pytest.raises(ConfigError, match="cannot reach a vLLM server"):
        load_teacher(load_config(None, ["distill.teacher.url=http://127.0.0.1:1"]), None)
    with pytest.raises(ConfigError, match="scores at temperature 1"):
        load_teacher(load_config(None, ["distill.teacher.url=http://127.0.0.1:1", "rollout.temperature=0.7"]), None)


# ----------------------------------------------------------------------------- real vLLM (marker vllm)

def _need_vllm():
    from credo.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    assert problem is None, f"the vllm tests need vLLM: {problem}"


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return _model(0)


@pytest.fixture(scope="module")
def engine(policy):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok = policy
    eng = VLLMRolloutEngine.from_model(model, tok, seed=0, options=VLLMOptions(dtype="float32"))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def teacher_server(tmp_path_factory):
    """A server-mode engine on a teacher (another seed's DEMO model): its server is the distillation teacher."""
    _need_vllm()
    from credo.models import save_model
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok = _model(7)
    path = tmp_path_factory.mktemp("teacher") / "model"
    save_model(model, tok, path)
    eng = VLLMRolloutEngine(path, tok, seed=0, options=VLLMOptions(dtype="float32", mode="server"),
                            log_dir=tmp_path_factory.mktemp("server"))
    yield eng, path, model
    eng.close()


SEQS = [[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82], [42]]


@pytest.mark.vllm
def test_score_ids_in_process_equals_the_trainers_forward(engine, policy):
    model, _ = policy
    got = engine.score_ids(SEQS, [1, 3, 1])
    want = model_token_logprobs(model, SEQS, [1, 3, 1])
    assert [len(r) for r in got] == [7, 2, 0]
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w)) < 1e-5  # float32 on both sides
    assert math.isnan(engine.score_ids([SEQS[0]], [0])[0][0])


@pytest.mark.vllm
def test_weight_sync_probe_passes_a_real_sync_and_trips_on_a_stale_one(engine, policy, monkeypatch):
    model, tok = policy
    original = {k: v.clone() for k, v in model.state_dict().items()}
    guards = Guards(GuardsConfig(weight_sync="warn"))
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        engine.update_weights(model, version=1)  # an ordinary sync: the probe agrees
        check_weight_sync(guards, model, engine, 1)
        assert guards.checks["weight_sync"] == 1 and guards.trips["weight_sync"] == 0
        monkeypatch.setattr(engine.transport, "sync", lambda state, version: None)  # the transfer silently lost
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        engine.update_weights(model, version=2)
        check_weight_sync(guards, model, engine, 2)
        assert guards.trips["weight_sync"] == 1
        with pytest.raises(GuardError, match="probe's log-probs differ"):
            check_weight_sync(Guards(), model, engine, 2)
    finally:
        monkeypatch.undo()
        model.load_state_dict(original)
        engine.update_weights(model, version=3)
    check_weight_sync(guards, model, engine, 3)
    assert guards.trips["weight_sync"] == 1


def _real_batch(tok):
    from credo.rollout import HFRolloutEngine
    from credo.models.batch import collate

    student, _ = _model(0)
    prompts = [Example("rev abc=", "cba", "a"), Example("12+3=", "15", "b"), Example("rev hgfedc=", "cdefgh", "c")]
    trajs = HFRolloutEngine(student, tok, seed=0).generate(prompts, 2, SamplingParams(max_new_tokens=8))
    return collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)


@pytest.mark.vllm
def test_server_teacher_equals_the_local_teacher_and_server_score_ids(teacher_server, policy):
    from credo.methods.distill.teacher import load_teacher, teacher_logprobs

    eng, path, model = teacher_server
    _, tok = policy
    got = eng.score_ids(SEQS, [1, 3, 1])  # server-mode score_ids
    want = model_token_logprobs(model, SEQS, [1, 3, 1])
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w)) < 1e-5
    batch = _real_batch(tok)
    local_cfg = load_config(None, [f"distill.teacher.path={path}"])
    server_cfg = load_config(None, [f"distill.teacher.url={eng.transport.url}"])
    local = teacher_logprobs(local_cfg, load_teacher(local_cfg, tok), batch)  # (B, T)
    teacher = load_teacher(server_cfg, tok)
    served = teacher_logprobs(server_cfg, teacher, batch)
    teacher.close()
    assert served.shape == local.shape and torch.isfinite(served).all()
    assert float((served - local).abs().max()) < 1e-4  # float32 on both sides
    assert float((served * batch.response_mask).abs().sum()) > 0  # real values on the response tokens


@pytest.mark.vllm
def test_a_train_run_with_a_server_teacher(teacher_server, tmp_path: Path):
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics
    from tests.conftest import TINY_RUN

    eng, _, _ = teacher_server
    run = tmp_path / "run"
    assert main(["-q", "train", "--run-dir", str(run), *TINY_RUN, "log.progress=false", "log.report=false",
                 "eval.every=0", "train.steps=2", f"distill.teacher.url={eng.transport.url}"]) == 0
    rows = read_metrics(run / "metrics.jsonl")[1:]
    assert len(rows) == 2
    for r in rows:
        assert r["distill/teacher_logprob"] < 0 and math.isfinite(r["distill/reverse_kl"]) and "timing_s/teacher" in r
