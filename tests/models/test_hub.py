"""Model paths by hub id (credo.models.hub): a hub cache written on disk in huggingface_hub's layout
(tests/hub_util.py), read offline (HF_HUB_OFFLINE=1) through huggingface_hub itself."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from credo.config import ConfigError, ModelConfig, load_config
from credo.config.hub_ref import HubId, parse_hub_id
from credo.models import load_model
from credo.models.hub import (HubModelNotFound, cached_model_path, hub_id_of, hub_origin, pin, resolve_model_path)
from tests.hub_util import add_model_dir, add_snapshot, save_tiny_model


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Two tiny models with different weights (seeds 0 and 1), saved once."""
    root = tmp_path_factory.mktemp("models")
    return save_tiny_model(root / "seed0", seed=0), save_tiny_model(root / "seed1", seed=1)


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny_dirs):
    """A hub cache in tmp_path with org/tiny: commit A (seed 0, tag v1) and commit B (seed 1, branch main); offline."""
    cache = tmp_path / "hub"
    a = add_model_dir(cache, "org/tiny", tiny_dirs[0], ref="v1", tag="a")
    b = add_model_dir(cache, "org/tiny", tiny_dirs[1], ref="main", tag="b")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return cache, a, b


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("value, expected", [
    ("Qwen/Qwen2.5-0.5B-Instruct", HubId("Qwen/Qwen2.5-0.5B-Instruct")),
    ("openai/gsm8k@main", HubId("openai/gsm8k", "main")),
    ("org/name@refs/pr/3", HubId("org/name", "refs/pr/3")),
    ("org/name@" + "a" * 40, HubId("org/name", "a" * 40)),
    ("runs/final", HubId("runs/final")),  # also a relative path: a local directory of that name wins (resolve_*)
    ("gpt2", None), ("/abs/dir", None), ("./org/name", None), ("~/models/x", None), ("a/b/c", None),
    ("org/name@", None), ("org--x/name", None), ("org/na..me", None), ("org/name.git", None), ("-org/name", None),
    (None, None), (3, None),
])
def test_parse_hub_id(value, expected):
    assert parse_hub_id(value) == expected


def test_the_cache_written_here_is_what_huggingface_hub_reads(hub):
    from huggingface_hub import scan_cache_dir, snapshot_download

    cache, a, b = hub
    info = scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == ("org/tiny", "model")
    assert {r.commit_hash: set(r.refs) for r in repo.revisions} == {a: {"v1"}, b: {"main"}}
    assert Path(snapshot_download("org/tiny", cache_dir=cache, local_files_only=True)).name == b
    assert Path(snapshot_download("org/tiny", revision="v1", cache_dir=cache, local_files_only=True)).name == a


def test_hub_id_resolves_offline_to_the_snapshot_of_its_revision(hub, tiny_dirs):
    cache, a, b = hub
    snap = cache / "models--org--tiny" / "snapshots"
    assert resolve_model_path("org/tiny") == snap / b
    assert resolve_model_path("org/tiny@main") == snap / b
    assert resolve_model_path("org/tiny@v1") == snap / a
    assert resolve_model_path(f"org/tiny@{a}") == snap / a
    assert hub_origin(snap / a) == hub_origin(resolve_model_path("org/tiny@v1"))
    assert str(hub_origin(snap / a)) == f"org/tiny@{a}"
    assert hub_origin(tiny_dirs[0]) is None
    # the weights of the revision asked for: the tag's are seed 0's, main's seed 1's
    for spec, saved in (("org/tiny@v1", tiny_dirs[0]), ("org/tiny", tiny_dirs[1])):
        model, tok = load_model(spec)
        expected, expected_tok = load_model(saved)
        got, want = weights(model), weights(expected)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
        assert tok("abc 12")["input_ids"] == expected_tok("abc 12")["input_ids"]  # its tokenizer came with it
    v1, main = weights(load_model("org/tiny@v1")[0]), weights(load_model("org/tiny")[0])
    assert any(not torch.equal(v1[k], main[k]) for k in v1)  # two revisions, two sets of weights


def test_a_local_directory_wins_over_a_hub_id_of_the_same_name(hub, tiny_dirs, tmp_path):
    local = tmp_path / "org" / "tiny"  # cwd is tmp_path: "org/tiny" is this directory
    save_tiny_model(local, seed=7)
    assert hub_id_of("org/tiny") is None
    assert resolve_model_path("org/tiny") == Path("org/tiny")
    model, _ = load_model("org/tiny")
    want, _ = load_model(local)
    assert all(torch.equal(a, b) for a, b in zip(weights(model).values(), weights(want).values()))


def test_missing_id_or_revision_offline_names_id_revision_cache_and_the_fix(hub):
    cache, _, _ = hub
    with pytest.raises(HubModelNotFound) as info:
        resolve_model_path("org/missing", key="critic.path")
    msg = str(info.value)
    assert msg.startswith("critic.path: org/missing is not a Hugging Face model directory (no config.json), nor")
    assert f"org/missing at revision main is not in {cache}" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "`hf download org/missing`" in msg
    with pytest.raises(HubModelNotFound, match=r"org/tiny at revision v9 is not in .*hf download "
                                                r"org/tiny --revision v9"):
        load_model("org/tiny@v9")
    assert isinstance(info.value, FileNotFoundError)  # the CLI's exit 1, as a missing local directory


def test_an_incomplete_cached_snapshot_is_reported_as_such(hub, tiny_dirs):
    cache, _, _ = hub
    files = {p.name: p for p in tiny_dirs[0].iterdir() if p.name != "model.safetensors"}
    add_snapshot(cache, "org/partial", files, missing=("model.safetensors",))  # the weights never arrived
    assert (cache / "models--org--partial" / "trees").is_dir()
    with pytest.raises(HubModelNotFound, match=r"org/partial at revision main misses files in "):
        resolve_model_path("org/partial")


def test_local_paths_keep_their_own_errors(hub, tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_model(tmp_path / "nowhere")
    assert str(info.value) == f"{tmp_path / 'nowhere'} is not a Hugging Face model directory (no config.json)"
    with pytest.raises(FileNotFoundError, match=r"^a/b/c is not a Hugging Face model directory"):
        load_model("a/b/c")  # three parts: never a hub id


def test_pin_names_the_commit_and_an_online_miss_says_the_hub_was_unreachable(hub, monkeypatch):
    _, a, b = hub
    assert pin("org/tiny") == f"org/tiny@{b}"
    assert pin("org/tiny@v1") == f"org/tiny@{a}"
    assert pin(f"org/tiny@{a}") == f"org/tiny@{a}"
    assert pin(None) is None and pin("/abs/dir") == "/abs/dir"
    assert cached_model_path("org/tiny@v1").name == a and cached_model_path("org/missing") is None
    # online (HF_HUB_OFFLINE unset) with the hub unreachable (an endpoint on 127.0.0.1 where nothing listens)
    import huggingface_hub.constants as hub_constants

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(HubModelNotFound) as info:
        pin("org/missing")
    assert "org/missing at revision main is not in" in str(info.value)
    assert "the hub could not be reached" in str(info.value) and "HF_HUB_OFFLINE=1" not in str(info.value)


def test_quiet_transformers_leaves_offline_mode_to_the_user(monkeypatch):
    from credo.models.build import quiet_transformers

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    quiet_transformers()
    assert "HF_HUB_OFFLINE" not in os.environ and "TRANSFORMERS_OFFLINE" not in os.environ


def test_remote_code_runs_only_with_model_trust_remote_code(hub, tiny_dirs, tmp_path, monkeypatch):
    """A repository that ships its model class (config.json auto_map): refused by default, loaded with the flag."""
    import sys

    import transformers.dynamic_module_utils as dyn

    monkeypatch.setattr(dyn, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # transformers copies the code there
    monkeypatch.setattr(sys, "path", list(sys.path))  # ... and puts that folder on sys.path: restored afterwards
    cache, _, _ = hub
    files = {p.name: p for p in tiny_dirs[0].iterdir()}
    config = json.loads(files.pop("config.json").read_text())
    config.update(model_type="xcustom", auto_map={"AutoConfig": "configuration_x.XConfig",
                                                  "AutoModelForCausalLM": "modeling_x.XModel"})
    add_snapshot(cache, "org/custom", {**files, "config.json": json.dumps(config).encode(),
                                       "configuration_x.py": b"from transformers import Qwen2Config\n"
                                       b"class XConfig(Qwen2Config):\n    model_type = 'xcustom'\n",
                                       "modeling_x.py": b"from transformers import Qwen2ForCausalLM\n"
                                       b"from .configuration_x import XConfig\n"
                                       b"class XModel(Qwen2ForCausalLM):\n    config_class = XConfig\n"})
    assert ModelConfig().trust_remote_code is False
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_model("org/custom")
    model, _ = load_model("org/custom", ModelConfig(trust_remote_code=True))
    assert type(model).__name__ == "XModel"


def test_preflight_resolves_and_pins_hub_ids_in_the_config(hub, tmp_path):
    from credo.recipes.preflight import check_model_dir, preflight

    _, a, b = hub
    cfg = load_config(None, ["model.path=org/tiny", "critic.path=org/tiny@v1"])
    preflight(cfg, run_dir=tmp_path / "run")
    assert (cfg.model.path, cfg.critic.path) == (f"org/tiny@{b}", f"org/tiny@{a}")
    check_model_dir("model.path", cfg.model.path)  # the pinned id resolves too
    with pytest.raises(HubModelNotFound, match="^model.path: org/gone is not a Hugging Face model directory"):
        preflight(load_config(None, ["model.path=org/gone"]), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_preset_keeps_a_hub_id_rather_than_a_path_beside_it(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("model:\n  path: org/tiny\ncritic:\n  path: sub/dir\n")
    (tmp_path / "sub" / "dir").mkdir(parents=True)
    cfg = load_config(str(preset))
    assert cfg.model.path == "org/tiny"  # no org/tiny beside the preset: a hub id
    assert cfg.critic.path == str(tmp_path / "sub" / "dir")  # exists beside the preset: a path, as before
    with pytest.raises(ConfigError, match="model.trust_remote_code: expected bool"):
        load_config(None, ["model.trust_remote_code=maybe"])


def test_plan_reads_a_cached_hub_models_config(hub):
    from credo.plan.cli import shape_of

    shape = shape_of(load_config(None, ["model.path=org/tiny"]).model)
    assert (shape.hidden, shape.layers) == (32, 2)
    with pytest.raises(FileNotFoundError, match="org/missing: credo plan reads the hub model's config.json"):
        shape_of(load_config(None, ["model.path=org/missing"]).model)


def test_a_lora_adapter_on_a_hub_base_names_it_and_finds_it_in_a_moved_cache(hub, tmp_path, monkeypatch):
    """The adapter's base record names the snapshot (org/name@commit): with the cache moved (its old paths gone),
    the base is found again through the hub cache (credo.models.lora.resolve_base)."""
    import shutil

    from credo.config.schema import LoraConfig
    from credo.models import save_model
    from credo.models.lora import BASE_FILE, apply_lora, resolve_base

    cache, a, _ = hub
    model, tok = load_model("org/tiny@v1")
    apply_lora(model, LoraConfig(r=2, target_modules=["q_proj"]), seed=0)
    model.credo_lora_base = str(resolve_model_path("org/tiny@v1"))
    save_model(model, tok, tmp_path / "adapter")
    record = json.loads((tmp_path / "adapter" / BASE_FILE).read_text())
    assert record["hub"] == f"org/tiny@{a}"
    moved = tmp_path / "moved-cache"
    shutil.move(cache, moved)
    monkeypatch.setenv("HF_HUB_CACHE", str(moved))
    assert resolve_base(tmp_path / "adapter") == (moved / "models--org--tiny" / "snapshots" / a).resolve()
    loaded, _ = load_model(tmp_path / "adapter")
    assert sum("lora_" in k for k in loaded.state_dict()) == 2 * 2  # A and B of q_proj in both layers


def test_a_pinned_id_keeps_its_weights_after_the_branch_moves(hub):
    cache, a, b = hub
    pinned = pin("org/tiny")  # what a run's config.yaml records
    (cache / "models--org--tiny" / "refs" / "main").write_text(a)  # main moves on after the run started
    assert resolve_model_path("org/tiny").name == a
    assert resolve_model_path(pinned).name == b  # a resumed run, credo eval, credo export: the same snapshot


def test_a_critic_and_a_reward_model_by_hub_id(hub, tiny_dirs, tmp_path):
    """critic.path and a reward model's path (reward.kwargs.path, credo rm serve) load a saved ValueModel by id."""
    from credo.models import ValueModel
    from credo.rewards.rm_scoring import LocalRewardModel

    cache, _, _ = hub
    policy, tok = load_model(tiny_dirs[0])
    critic = ValueModel.from_policy(policy)
    critic.save(tmp_path / "critic")
    tok.save_pretrained(tmp_path / "critic")
    commit = add_model_dir(cache, "org/critic", tmp_path / "critic")
    ids = torch.tensor([tok.encode("abc")])
    args = (ids, torch.ones_like(ids), torch.arange(ids.shape[1]).unsqueeze(0))
    with torch.no_grad():
        want = critic(*args)
        torch.testing.assert_close(ValueModel.load("org/critic")(*args), want, rtol=0, atol=0)
        torch.testing.assert_close(ValueModel.load(f"org/critic@{commit}")(*args), want, rtol=0, atol=0)
    rm = LocalRewardModel("org/critic")
    assert rm.path == str(cache / "models--org--critic" / "snapshots" / commit)
    assert len(rm.score(["a"], ["b"])) == 1
    with pytest.raises(HubModelNotFound, match="^critic.path: org/nocritic is not"):
        ValueModel.load("org/nocritic")
