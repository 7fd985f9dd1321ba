"""The trainer side of the credo_torchdist weight sync without vLLM (credo.rollout.torchdist_sync): bucket planning
and packing, the changed-tensor tracker, and whole syncs into a stand-in engine that joins the gloo group from a
thread of this process the way vLLM's workers do (credo.rollout.vllm_torchdist_receiver)."""
from __future__ import annotations

import time

import pytest
import torch

from credo.rollout.torchdist_sync import (ALIGN, ChangeTracker, TorchDistWeightSync, broadcast, check_bucket,
                                          checksum, load_unit, open_group, pack, plan_buckets, unpack)
from credo.rollout.vllm_sync import SafetensorsSync, make_weight_sync


class FakeEngine:
    """vLLM's weight-sync client contract, served by a rank-1 group member that keeps what it receives."""

    text_chunks = False

    def __init__(self, *, reject: bool = False) -> None:
        self.held: dict[str, torch.Tensor] = {}
        self.version: str | None = None
        self.group = None
        self.received: list[list[str]] = []
        self.reject = reject

    def init_weight_transfer_engine(self, info: dict) -> None:
        if self.reject and info:
            raise RuntimeError("vLLM server init_weight_transfer_engine: HTTP 500: Invalid init_info")
        if info:
            self.group = open_group(info["master_address"], info["master_port"], rank=1,
                                    world_size=info["world_size"], timeout_s=info["timeout_s"])

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, info: dict) -> None:
        if "blob" in info:
            from safetensors.torch import load

            self.held.update(load(info["blob"]))
            return
        names = []
        for meta in info["buckets"]:
            check_bucket(meta)
            buf = torch.empty(meta["nbytes"], dtype=torch.uint8)
            broadcast(self.group, buf).wait()
            for name, t in unpack(buf, meta):
                self.held[name] = t.clone()
                names.append(name)
        self.received.append(names)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.version = weight_version

    def served_version(self) -> str | None:
        return self.version


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(50, 16, generator=g)
    state = {"model.embed_tokens.weight": emb}
    for i in range(3):
        p = f"model.layers.{i}."
        state |= {p + "self_attn.q_proj.weight": torch.randn(16, 16, generator=g),
                  p + "self_attn.k_proj.weight": torch.randn(8, 16, generator=g),
                  p + "mlp.down_proj.weight": torch.randn(16, 40, generator=g).to(torch.bfloat16),
                  p + "input_layernorm.weight": torch.ones(16)}
    return state | {"model.norm.weight": torch.ones(16), "lm_head.weight": emb}  # tied: one storage, two names


def test_buckets_keep_order_and_size_and_round_trip_mixed_dtypes():
    items = [("a", torch.arange(10, dtype=torch.float32)), ("b", torch.ones(3, 5, dtype=torch.bfloat16)),
             ("c", torch.arange(7, dtype=torch.int64)), ("d", torch.randn(6, 4).t()),  # not contiguous
             ("big", torch.randn(100)), ("e", torch.tensor([True, False, True]))]
    buckets = plan_buckets(items, bucket_bytes=200)
    assert [n for b in buckets for n in b["names"]] == [n for n, _ in items]
    assert ["big"] in [b["names"] for b in buckets]  # larger than a bucket: alone
    for b in buckets:
        check_bucket(b)
        assert all(off % ALIGN == 0 for off in b["offsets"])
        assert b["nbytes"] <= 200 or len(b["names"]) == 1
    got = {}
    for b in buckets:
        tensors = [dict(items)[n] for n in b["names"]]
        got.update({n: t.clone() for n, t in unpack(pack(tensors, b), b)})
    for name, t in items:
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
    with pytest.raises(ValueError, match="do not fit"):
        check_bucket(buckets[0] | {"nbytes": 8})
    with pytest.raises(ValueError, match="unknown dtype"):
        check_bucket(buckets[0] | {"dtypes": ["float99"] * len(buckets[0]["names"])})
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(items, bucket_bytes=0)


def test_load_units_are_decoder_layers_or_parent_modules():
    assert load_unit("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert load_unit("model.layers.3.mlp.gate_proj.weight") == "model.layers.3"
    assert load_unit("model.layers.12.input_layernorm.weight") == "model.layers.12"
    assert load_unit("model.embed_tokens.weight") == "model.embed_tokens"
    assert load_unit("lm_head.weight") == "lm_head"


def test_checksum_sees_one_changed_element_and_a_swap():
    t = torch.randn(37, 1021 * 2 + 5)
    base = checksum(t)
    assert checksum(t.clone()) == base
    one = t.clone()
    one[20, 300] += 1e-3
    assert checksum(one) != base
    words = torch.randint(-2**62, 2**62, (7000,))  # two words swap rows
    moved = words.clone()
    moved[0], moved[5000] = words[5000], words[0]
    assert moved.sum() == words.sum() and checksum(moved) != checksum(words)
    shifted = words.clone()  # +d and -d at once: the same sum, another xor
    shifted[3] += 12345
    shifted[4] -= 12345
    assert shifted.sum() == words.sum() and checksum(shifted) != checksum(words)
    assert checksum(t.to(torch.bfloat16)) != checksum(t)
    odd = torch.tensor([1, 2, 3], dtype=torch.uint8)  # sizes no multiple of 8: the tail bytes count
    assert checksum(odd) != checksum(torch.tensor([1, 2, 4], dtype=torch.uint8))
    assert checksum(torch.arange(10.0)[1:]) == checksum(torch.arange(10.0)[1:].clone())  # an offset view


def test_tracker_sends_changed_layers_and_everything_after_another_client_synced():
    state = _state()
    tracker = ChangeTracker()
    names, sums = tracker.select(state)
    assert names == list(state)  # nothing sent yet: all
    tracker.commit(sums, "1")
    assert tracker.select(state, served_version="1")[0] == []
    state["model.layers.1.self_attn.k_proj.weight"][0, 0] += 1.0
    names, _ = tracker.select(state, served_version="1")
    assert names == [n for n in state if n.startswith("model.layers.1.")]  # the whole layer (vLLM fuses q/k/v)
    assert tracker.select(state, served_version="7")[0] == list(state)  # someone else synced the engine


def test_sync_over_gloo_sends_buckets_then_only_what_changed_versioned():
    engine = FakeEngine()
    sender = TorchDistWeightSync(engine, bucket_bytes=4096, timeout_s=20)
    sender.init()
    try:
        state = _state()
        stats = sender.sync(state, version=1)
        assert engine.version == "1" and stats.buckets > 1 and stats.tensors == len(state)
        assert all(torch.equal(engine.held[n], t) for n, t in state.items())
        state["model.layers.2.mlp.down_proj.weight"].mul_(2)  # an optimizer step touches one layer
        stats = sender.sync(state, version=2)
        assert engine.received[-1] == [n for n in state if n.startswith("model.layers.2.")]
        assert stats.bytes < stats.bytes_total / 2 and engine.version == "2"
        assert all(torch.equal(engine.held[n], t) for n, t in state.items())
        stats = sender.sync(state, version=3)  # nothing changed: no bucket, still versioned
        assert stats.buckets == 0 and engine.version == "3"
        engine.version = "99"  # another trainer synced this engine: the next sync is a full one
        assert sender.sync(state, version=4).tensors == len(state)
        full = TorchDistWeightSync(engine, bucket_bytes=1 << 20, timeout_s=20, only_changed=False)
        full.init()  # the engine re-joins the new sender's group
        try:
            assert full.sync(state, version=5).tensors == len(state) and engine.version == "5"
        finally:
            full.close()
    finally:
        sender.close()


def test_a_wrong_rendezvous_fails_in_one_line_within_the_timeout():
    engine = FakeEngine()
    from credo.rollout.torchdist_sync import free_port

    sender = TorchDistWeightSync(engine, timeout_s=3, advertise=("127.0.0.1", free_port()))  # nobody listens there
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        sender.init()
    assert time.monotonic() - t0 < 15
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("torchdist weight sync: vLLM's worker(s) did not join the process group")
    assert sender.group is None


def test_auto_falls_back_to_safetensors_where_the_engine_rejects_torchdist():
    state = _state()
    engine = FakeEngine(reject=True)
    sender = make_weight_sync("auto", engine, timeout_s=3)
    assert isinstance(sender, SafetensorsSync)
    sender.sync(state, version=3)
    assert engine.version == "3" and all(torch.equal(engine.held[n], t) for n, t in state.items())
    with pytest.raises(RuntimeError, match="Invalid init_info"):
        make_weight_sync("torchdist", FakeEngine(reject=True), timeout_s=3)
    assert isinstance(make_weight_sync("torchdist", FakeEngine(), timeout_s=10), TorchDistWeightSync)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            make_weight_sync("nccl", FakeEngine())
    with pytest.raises(ValueError, match="one of"):
        make_weight_sync("rdma", FakeEngine())
