"""The credo_torchdist weight sync against vLLM itself (its CPU build here): a gloo group between this process and
vLLM's worker, metadata in the update request, the tensors broadcast in buckets. In process, to a server credo
starts and to a server given by URL, the engine serves the trainer's weights after a sync (its log-probs are the
trainer's), reports the version, receives only the changed layers the second time, and a wrong rendezvous fails
in one line within its timeout. Marker ``vllm`` (run in the vLLM venv); one engine of each kind for the module."""
from __future__ import annotations

import time

import pytest
import torch

from credo.config import ModelConfig

pytestmark = pytest.mark.vllm

SEQS = ["rev abc=cba", "rev hgfedc=cdefgh", "12+3=15 and more text to score"]


def _need_vllm():
    from credo.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    assert problem is None, f"the vllm tests need vLLM: {problem}"


def _options(**kw):
    from credo.rollout.vllm_transport import VLLMOptions

    # small buckets: a sync of the demo model (2 MB) spans several
    return VLLMOptions(**({"dtype": "float32", "weight_sync": "torchdist", "weight_sync_bucket_mb": 1} | kw))


@pytest.fixture(scope="module")
def policy():
    from credo.models import build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(), seed=0)


@pytest.fixture(scope="module")
def engine(policy):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    model, tok = policy
    eng = VLLMRolloutEngine.from_model(model, tok, seed=0, options=_options())
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server_engine(policy, tmp_path_factory):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    model, tok = policy
    eng = VLLMRolloutEngine.from_model(model, tok, seed=0, options=_options(mode="server"),
                                       log_dir=tmp_path_factory.mktemp("server"))
    yield eng
    eng.close()


def _gap(engine, model, tok) -> float:
    """The largest difference between the engine's prompt log-probs and the trainer's for SEQS."""
    ids = [tok(s)["input_ids"] for s in SEQS]
    served = engine.score_ids(ids, [1] * len(ids))
    worst = 0.0
    with torch.no_grad():
        for q, got in zip(ids, served):
            x = torch.tensor([q])
            lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
            ref = lp.gather(-1, x[0, 1:, None])[:, 0]
            worst = max(worst, float((torch.tensor(got) - ref).abs().max()))
    return worst


def _sender(engine):
    t = engine.transport
    return t.weights if hasattr(t, "llm") else t.sender


def _perturb(model, seed: int, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _check_sync(engine, model, tok, first_version: int) -> None:
    from credo.rollout.torchdist_sync import TorchDistWeightSync

    sender = _sender(engine)
    assert isinstance(sender, TorchDistWeightSync) and sender.group is not None
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        assert _gap(engine, model, tok) < 1e-5
        _perturb(model, first_version)
        assert _gap(engine, model, tok) > 1e-3  # the engine still serves the old weights
        engine.update_weights(model, version=first_version)
        assert engine.served_version() == str(first_version)
        assert sender.stats.tensors == sender.stats.tensors_total and sender.stats.buckets > 1
        assert _gap(engine, model, tok) < 1e-5
        # one tensor changes: only its decoder layer travels, and the engine serves the new weights
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(1.5)
        engine.update_weights(model, version=first_version + 1)
        assert engine.served_version() == str(first_version + 1)
        assert 0 < sender.stats.tensors < sender.stats.tensors_total / 2
        assert sender.stats.bytes < sender.stats.bytes_total / 2
        assert _gap(engine, model, tok) < 1e-5
    finally:
        model.load_state_dict(original)
    engine.update_weights(model, version=first_version + 2)
    assert _gap(engine, model, tok) < 1e-5


def test_in_process_sync_serves_the_trainers_weights_versioned_and_only_changed(engine, policy):
    model, tok = policy
    _check_sync(engine, model, tok, first_version=1)


def test_server_sync_serves_the_trainers_weights_versioned_and_only_changed(server_engine, policy):
    model, tok = policy
    _check_sync(server_engine, model, tok, first_version=5)


def test_a_server_given_by_url_has_its_workers_join_the_guests_group(server_engine, policy):
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    model, tok = policy
    original = {k: v.clone() for k, v in model.state_dict().items()}
    guest = VLLMRolloutEngine(None, tok, seed=0, options=_options(mode="server", url=server_engine.transport.url))
    try:
        assert guest.transport.proc is None and _sender(guest).group is not None
        _perturb(model, 21)
        guest.update_weights(model, version=21)
        assert guest.served_version() == "21" and _gap(guest, model, tok) < 1e-5
        assert _sender(guest).stats.tensors == _sender(guest).stats.tensors_total  # the guest sent everything
    finally:
        guest.close()
        model.load_state_dict(original)
    # the server's worker now listens to the guest's (closed) group: the owner joins again, and since the served
    # version is not the one it last sent, its next sync sends everything
    server_engine.transport.sender.init()
    server_engine.update_weights(model, version=22)
    assert server_engine.served_version() == "22" and _gap(server_engine, model, tok) < 1e-5


def test_a_wrong_rendezvous_fails_in_one_line_and_the_engine_still_syncs(engine, policy):
    from credo.rollout.torchdist_sync import TorchDistWeightSync, free_port
    from credo.rollout.vllm_sync import LLMClient

    model, tok = policy
    wrong = TorchDistWeightSync(LLMClient(engine.transport.llm), timeout_s=3,
                                advertise=("127.0.0.1", free_port()))  # nobody listens there
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        wrong.init()
    assert time.monotonic() - t0 < 30
    msg = str(err.value)
    assert "\n" not in msg and "did not join the process group" in msg and "within 3 s" in msg, msg
    # the worker survived: the engine's own sender joins again and syncs
    engine.transport.weights.init()
    engine.update_weights(model, version=31)
    assert engine.served_version() == "31" and _gap(engine, model, tok) < 1e-5


def test_auto_falls_back_to_safetensors_on_a_server_started_with_credo_safetensors(policy, tmp_path, caplog):
    """A server given by URL that was started with the old backend rejects torchdist's init at once: auto syncs
    through the requests instead (with a warning), and the engine serves the trainer's weights."""
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_sync import SafetensorsSync

    _need_vllm()
    model, tok = policy
    owner = VLLMRolloutEngine.from_model(model, tok, seed=0, log_dir=tmp_path,
                                         options=_options(mode="server", weight_sync="safetensors"))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        t0 = time.monotonic()
        guest = VLLMRolloutEngine(None, tok, seed=0, options=_options(mode="server", url=owner.transport.url,
                                                                      weight_sync="auto"))
        assert time.monotonic() - t0 < 30  # the rejection is immediate: no rendezvous timeout waited out
        try:
            assert isinstance(guest.transport.sender, SafetensorsSync)
            assert "torchdist could not start" in caplog.text
            _perturb(model, 41)
            guest.update_weights(model, version=41)
            assert guest.served_version() == "41" and _gap(guest, model, tok) < 1e-5
        finally:
            guest.close()
    finally:
        model.load_state_dict(original)
        owner.close()


def test_the_state_source_for_vllms_own_engines_agrees_with_itself(policy):
    """vLLM's nccl / ipc trainer engines (weight_sync=nccl|ipc, CUDA only, never run here) read a WeightSource:
    its metadata() must enumerate what its iteration yields, in order (vLLM checks it while sending), and its
    groups() must cover every name once."""
    _need_vllm()
    from vllm.distributed.weight_transfer.base import WeightSource

    from credo.rollout.vllm_sync import _StateSource

    model, _ = policy
    source = _StateSource()
    source.state = model.state_dict()
    meta = source.metadata()
    pairs = list(source)
    assert [(m.name, m.dtype, m.shape) for m in meta] == [(n, t.dtype, tuple(t.shape)) for n, t in pairs]
    assert sorted(n for g in source.groups() for n in g) == sorted(source.state)
    assert [n for names, _ in WeightSource.iter_groups(source) for n in names] == [n for n, _ in pairs]
