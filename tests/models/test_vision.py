"""Vision-language policies: the tiny LLaVA built from a config, the ``shapes`` task, ``pixel_values`` through every
forward, VEPO's image perturbations and the image-perturbed forward, the config refusals, and tiny runs through
the recipe (``shared/spec/seed-additions.md`` C.6; docs/algorithms/vepo.md "Images")."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from credo.config import ConfigError, ModelConfig, load_config
from credo.data import build_splits, get_task
from credo.data.shapes import COLORS, render, shape_mask
from credo.methods.vepo.image import IMAGE_PERTURBATIONS, image_rng, perturb_images, region_mask
from credo.methods.vepo.select import grounding_stats, perturbed_image_batch
from credo.models.vision import IMAGE_TOKEN, expand_image_prompts, image_token_count, normalize_pixels, raw_pixels
from credo.rewards.shapes import shapes_match
from credo.types import Example, RewardResult, SamplingParams, Trajectory

VISION_RUN = ["model.arch=llava", "task.name=shapes", "model.hidden_size=32", "model.intermediate_size=64",
              "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1", "model.max_position_embeddings=64",
              "model.vision.hidden=16", "model.vision.intermediate=32", "model.vision.layers=1",
              "model.vision.heads=2", "task.train_size=64", "task.eval_size=8", "train.prompts_per_step=4",
              "rollout.group_size=4", "rollout.max_new_tokens=6", "warm_start.steps=2", "warm_start.batch_size=8",
              "eval.k=2", "eval.every=0", "checkpoint.every=0", "log.progress=false", "log.report=false",
              "log.tensorboard=false", "reward.workers=1"]


def _tiny(**vision):
    from credo.models import build_model

    cfg = ModelConfig(arch="llava", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                      max_position_embeddings=64)
    cfg.vision = dataclasses.replace(cfg.vision, hidden=16, intermediate=32, layers=1, heads=2, **vision)
    return build_model(cfg, seed=0)


@pytest.fixture(scope="module")
def tiny():
    return _tiny()


def _examples(n=6, kind="color", seed=0):
    train, _ = build_splits(get_task("shapes", kind=kind), train_size=n, eval_size=2, seed=seed)
    return train


def _data(model, examples):
    from credo.data.source import TaskData

    data = TaskData("shapes", examples, examples[:2], "shapes", lambda e: e.answer)
    return expand_image_prompts(data, model)


def _with_pixels(batch, pixels):
    """The batch with other images (the extra ``pixel_values``; the batch's own extras untouched)."""
    return dataclasses.replace(batch, extras={**batch.extras, "pixel_values": pixels})


def _batch(model, tok, examples, n=2, seed=0):
    from credo.rollout import HFRolloutEngine
    from credo.models.batch import collate

    engine = HFRolloutEngine(model, tok, seed=seed)
    trajs = engine.generate(examples, n, SamplingParams(max_new_tokens=5))
    return collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id), trajs


# ------------------------------------------------------------------------------------------ model and tokenizer

def test_llava_from_config_tokenizer_and_local_directory(tiny, tmp_path: Path):
    from credo.models import load_model, save_model

    model, tok = tiny
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    assert image_id == 101 and tok.pad_token_id == 0 != image_id  # 100 characters + 4 specials, then <image>
    assert model.config.image_token_id == image_id and model.config.model_type == "llava"
    assert image_token_count(model.config) == 16  # (32 / 8)^2 patches, CLS dropped
    assert image_token_count(_tiny(feature_select="full")[0].config) == 17
    assert tok("<image><image>ab", add_special_tokens=True)["input_ids"] == [1, image_id, image_id, 14, 15]
    save_model(model, tok, tmp_path / "m")
    loaded, tok2 = load_model(tmp_path / "m")
    assert type(loaded).__name__ == "LlavaForConditionalGeneration"
    assert tok2.convert_tokens_to_ids(IMAGE_TOKEN) == image_id
    ex = _data(model, _examples(2)).train
    b1, _ = _batch(model, tok, ex)
    from credo.train.forward import NAIVE, batched_logprobs

    lp1, _ = batched_logprobs(model, b1, micro_batch_size=None, opts=NAIVE)
    lp2, _ = batched_logprobs(loaded, b1, micro_batch_size=None, opts=NAIVE)
    assert torch.equal(lp1, lp2)


# ------------------------------------------------------------------------------------------ the shapes task

def test_shapes_render_the_scene_spec_and_answers_match_it():
    # hand-drawn scene: a red square in the top-left quadrant and a blue circle in the bottom-right one
    scene = [{"kind": "square", "color": "red", "quadrant": "top left", "box": [2, 3, 12, 13]},
             {"kind": "circle", "color": "blue", "quadrant": "bottom right", "box": [18, 18, 30, 30]},
             {"kind": "triangle", "color": "yellow", "quadrant": "top right", "box": [19, 1, 29, 11]}]
    img = render(scene)
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8
    assert img[7, 6].tolist() == [255, 0, 0] and img[3, 2].tolist() == [255, 0, 0]  # square: corners included
    assert img[2, 2].tolist() == [0, 0, 0] and img[3, 12].tolist() == [0, 0, 0]  # just outside [2, 12) x [3, 13)
    assert img[24, 24].tolist() == [0, 0, 255] and img[18, 18].tolist() == [0, 0, 0]  # circle: corner is outside
    assert img[6, 24].tolist() == [255, 255, 0]  # triangle centre
    # triangle rows: half width (y + .5 - 1) / 10 * 5 around cx = 24. Row 1: 0.25 < 0.5, no pixel centre inside;
    # row 2: 0.75 -> centres 23.5, 24.5; row 10: 4.75 -> centres 19.5 .. 28.5 (the whole box width)
    assert img[1].any(-1).nonzero()[0].tolist() == []
    assert img[2].any(-1).nonzero()[0].tolist() == [23, 24]
    assert (img[10, 16:].any(-1).nonzero()[0] + 16).tolist() == list(range(19, 29))  # (the square fills 2..11)
    assert shape_mask("square", [2, 3, 12, 13]).sum() == 100  # 10 x 10
    # every generated example: the pixel at each object's box centre has its colour; the answer follows the spec
    for kind in ("color", "count", "where"):
        for ex in _examples(40, kind=kind):
            scene = ex.meta["scene"]
            for obj in scene:
                x0, y0, x1, y1 = obj["box"]
                assert ex.meta["image"][(y0 + y1) // 2, (x0 + x1) // 2].tolist() == list(COLORS[obj["color"]])
                assert 10 <= x1 - x0 == y1 - y0 <= 13
            q = ex.prompt[len(IMAGE_TOKEN):]
            if kind == "color":
                (obj,) = [o for o in scene if f"the {o['kind']}?" in q]
                assert ex.answer == obj["color"] and ex.meta["regions"] == [obj["box"]]
            elif kind == "count":
                shape = q.split()[-1][:-2]  # "how many circles?" -> "circle"
                assert ex.answer == str(sum(o["kind"] == shape for o in scene))
            else:
                (obj,) = [o for o in scene if f"the {o['color']} shape" in q]
                assert ex.answer == obj["quadrant"]


def test_shapes_splits_are_seeded_and_held_out_and_the_verifier_normalises():
    task = get_task("shapes")
    train, eval_ = build_splits(task, train_size=300, eval_size=50, seed=3)
    train2, eval2 = build_splits(task, train_size=300, eval_size=50, seed=3)
    key = lambda e: (e.prompt, e.meta["image"].tobytes())  # noqa: E731
    assert [key(e) for e in train] == [key(e) for e in train2] and [key(e) for e in eval_] == [key(e) for e in eval2]
    held = {key(e) for e in eval_}
    assert len(held) == 50 and not held & {key(e) for e in train}
    assert [key(e) for e in build_splits(task, train_size=5, eval_size=5, seed=4)[1]] != [key(e) for e in eval_[:5]]
    ex = Example("q", "red")
    assert [shapes_match(r, ex).score for r in ("red", " Red. ", "red!", "it is red.")] == [1.0, 1.0, 0.0, 0.0]
    sentence = build_splits(get_task("shapes", answer_style="sentence"), train_size=3, eval_size=1, seed=0)[0]
    assert all(e.answer.startswith("it is ") and e.answer.endswith(".") for e in sentence)
    with pytest.raises(ValueError, match="kind"):
        get_task("shapes", kind="size")


# ------------------------------------------------------------------------------------------ the forward paths

def test_forward_generate_and_every_path_agree_with_credos_layout(tiny):
    """Left-padded prompts of different lengths: the engine's log-probs, the naive forward, the chunked forward,
    the shared-prompt forward and one row alone agree; images reach every path (a changed image changes them)."""
    from credo.train.forward import NAIVE, ForwardOptions, batched_logprobs

    model, tok = tiny
    examples = _data(model, _examples(4)).train
    batch, trajs = _batch(model, tok, examples, n=3)
    assert batch.extra("pixel_values").shape == (12, 3, 32, 32) and len({len(t.prompt_ids) for t in trajs}) > 1
    assert trajs[0].prompt_ids[:18] == [tok.bos_token_id] + [tok.convert_tokens_to_ids(IMAGE_TOKEN)] * 16 + \
        [tok.convert_tokens_to_ids("w")]  # <bos> + 16 <image> + "what color ..."
    naive, _ = batched_logprobs(model, batch, micro_batch_size=None, opts=NAIVE)
    chunked, _ = batched_logprobs(model, batch, micro_batch_size=5, opts=ForwardOptions(chunk_size=7))
    unshared, _ = batched_logprobs(model, batch, micro_batch_size=None, opts=ForwardOptions(share_prompt=False))
    valid = batch.response_mask.bool()
    for other in (chunked, unshared):
        assert torch.allclose(naive[valid], other[valid], atol=1e-5)
    # the engine never samples <image>: its log-probs are the trainer's renormalised without it,
    # log p - log(1 - p(<image>)), so a little higher (an untrained model gives <image> about 1/102)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    assert not (batch.responses == image_id).any()
    lift = (batch.rollout_logprobs - naive)[valid]
    assert (lift > 0).all() and (lift < 0.05).all()
    alone, _ = batched_logprobs(model, batch.select(torch.tensor([4])), micro_batch_size=None, opts=NAIVE)
    assert torch.allclose(alone[0], naive[4], atol=1e-5)
    flipped = _with_pixels(batch, batch.extra("pixel_values").flip(-1))
    moved, _ = batched_logprobs(model, flipped, micro_batch_size=None, opts=ForwardOptions())
    assert (moved - naive)[valid].abs().max() > 1e-4
    # one prompt text, two images: the shared-prompt forward must not merge the rows
    same = [dataclasses.replace(examples[0], meta=examples[k].meta) for k in (0, 1)]
    b2, _ = _batch(model, tok, same, n=2)
    s2, _ = batched_logprobs(model, b2, micro_batch_size=None, opts=ForwardOptions())
    n2, _ = batched_logprobs(model, b2, micro_batch_size=None, opts=NAIVE)
    assert torch.allclose(s2, n2, atol=1e-5)


def test_update_gradients_agree_across_forward_paths():
    """The shared-prompt forward (each prompt + image once, the G responses on its cache) and the naive forward give
    the same gradients, vision tower included: the update sees each row's own image."""
    from credo.train.forward import NAIVE, ForwardOptions, policy_logprobs

    model, tok = _tiny()
    batch, _ = _batch(model, tok, _data(model, _examples(3)).train, n=3)
    grads = []
    for opts in (NAIVE, ForwardOptions(), ForwardOptions(share_prompt=False, chunk_size=5)):
        model.zero_grad()
        lp, _ = policy_logprobs(model, batch, opts=opts)
        (lp * torch.arange(1.0, lp.shape[0] + 1)[:, None]).sum().backward()  # rows weighted apart
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    tower = model.model.vision_tower.embeddings.patch_embedding.weight.grad
    assert tower is not None and tower.abs().max() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-5) and torch.allclose(grads[0], grads[2], atol=1e-5)


def test_select_trim_and_collate_carry_the_images(tiny):
    from credo.train.forward import trim

    model, tok = tiny
    batch, trajs = _batch(model, tok, _data(model, _examples(3)).train, n=2)
    raw = raw_pixels([t.example.meta["image"] for t in trajs])
    pixels = batch.extra("pixel_values")  # (B, 3, H, W)
    assert torch.equal(pixels, normalize_pixels(raw)) and pixels.min() == -1.0
    sub = batch.select(torch.tensor([5, 0]))
    assert torch.equal(sub.extra("pixel_values"), pixels[[5, 0]])
    assert torch.equal(trim(sub).extra("pixel_values"), sub.extra("pixel_values"))  # trimmed columns, not channels
    with pytest.raises(ValueError, match="no image"):
        t = dataclasses.replace(trajs[0], example=Example("x", "y"))
        from credo.models.batch import collate

        collate([trajs[1], t], [RewardResult(0.0)] * 2, pad_id=0)


def test_critic_reads_the_images(tiny):
    from credo.models import ValueModel
    from credo.train.forward import batched_values

    model, tok = tiny
    batch, _ = _batch(model, tok, _data(model, _examples(2)).train)
    critic = ValueModel.from_policy(model)
    torch.nn.init.normal_(critic.value_head.weight, std=1.0)
    v1, _ = batched_values(critic, batch, micro_batch_size=None)
    v2, _ = batched_values(critic, _with_pixels(batch, -batch.extra("pixel_values")), micro_batch_size=None)
    assert v1.shape == batch.responses.shape and (v1 - v2).abs().max() > 1e-4


# ------------------------------------------------------------------------------------------ image perturbations

def _raw_and_meta():
    ex = _examples(3)
    return raw_pixels([e.meta["image"] for e in ex]), [e.meta for e in ex]


@pytest.mark.parametrize("name", sorted(IMAGE_PERTURBATIONS))
@pytest.mark.parametrize("regions", ["whole", "meta"])
def test_image_perturbations_keep_shape_range_and_are_seeded(name, regions):
    raw, metas = _raw_and_meta()
    run = lambda seed, step: perturb_images(raw, metas, perturb=name, perturb_args={}, regions=regions,  # noqa: E731
                                            seed=seed, step=step)
    a = run(0, 1)
    assert a.shape == raw.shape and a.min() >= 0.0 and a.max() <= 1.0
    assert torch.equal(a, run(0, 1))  # a pure function of (seed, step, row)
    assert not torch.equal(a, raw)
    if name in ("gaussian", "patch_blacken", "resample"):  # random ones: another step draws other noise
        assert not torch.equal(a, run(0, 2)) and not torch.equal(a, run(1, 1))
    if regions == "meta" and name != "resample":  # outside the queried object's box nothing moves
        for row, meta in enumerate(metas):
            outside = ~region_mask(meta["regions"], 32, 32)
            assert torch.equal(a[row][:, outside], raw[row][:, outside])


def test_gaussian_std_zero_is_the_identity_and_patch_blacken_prob_one_blacks_the_regions_only():
    raw, metas = _raw_and_meta()
    same = perturb_images(raw, metas, perturb="gaussian", perturb_args={"std": 0.0}, regions="whole", seed=0, step=0)
    assert torch.equal(same, raw)
    black = perturb_images(raw, metas, perturb="patch_blacken", perturb_args={"prob": 1.0}, regions="meta", seed=0,
                           step=0)
    for row, meta in enumerate(metas):
        inside = region_mask(meta["regions"], 32, 32)
        assert inside.sum() > 0 and (black[row][:, inside] == 0).all()
        assert torch.equal(black[row][:, ~inside], raw[row][:, ~inside])
    # gaussian by hand: the row's noise is the seeded generator's first 3 * 32 * 32 normal draws
    xi = torch.from_numpy(image_rng(7, 3, 1).standard_normal((3, 32, 32))).float()
    noisy = perturb_images(raw, metas, perturb="gaussian", perturb_args={"std": 0.5}, regions="whole", seed=7, step=3)
    assert torch.allclose(noisy[1], (raw[1] + 0.5 * xi).clamp(0, 1))


def test_perturbed_batch_keeps_input_ids_and_identical_image_gives_zero_jsd(tiny):
    from credo.train.forward import ForwardOptions

    model, tok = tiny
    batch, trajs = _batch(model, tok, _data(model, _examples(3)).train)
    intact = batch.extra("pixel_values").clone()
    pb = perturbed_image_batch(batch, trajs, perturb="gaussian", perturb_args={}, regions="whole", seed=0, step=0)
    for f in dataclasses.fields(batch):
        a, b = getattr(batch, f.name), getattr(pb, f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
    assert torch.equal(pb.extra("sampled"), batch.extra("sampled"))
    a, b = batch.extra("pixel_values"), pb.extra("pixel_values")
    assert not torch.equal(a, b) and a.shape == b.shape
    assert torch.equal(a, intact)  # the intact batch keeps its images
    same = perturbed_image_batch(batch, trajs, perturb="gaussian", perturb_args={"std": 0.0}, regions="whole",
                                 seed=0, step=0)
    st = grounding_stats(model, batch, same, opts=ForwardOptions())
    assert st.jsd.abs().max() < 1e-6 and st.gap.abs().max() < 1e-5
    st = grounding_stats(model, batch, pb, opts=ForwardOptions())
    assert st.jsd[batch.response_mask.bool()].max() > 1e-7  # an untrained model still reads the image a little


# ------------------------------------------------------------------------------------------ VEPO on a trained model

@pytest.mark.slow
def test_sft_model_is_more_vision_sensitive_on_the_colour_token_than_on_eos():
    """After SFT on ``color`` questions the colour word's first character depends on the image (high Vis under the
    default Gaussian noise and under flat grey) while EOS, which follows the fixed word, does not; VEPO's top 20%
    by Vis x H is then mostly colour tokens (C.6 item 8; the text test's image twin). The untrained model shows no
    such gap. About 90 s on one thread."""
    from credo.data.source import load_task_data
    from credo.methods.vepo.algo import grounding_sensitivity
    from credo.methods.vepo.select import select
    from credo.models import build_model
    from credo.train.forward import ForwardOptions
    from credo.train.sft import demonstration_batch, run_sft

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_config("vepo_vision")
        model, tok = build_model(cfg.model, seed=0)
        data = expand_image_prompts(load_task_data(cfg.task, seed=0), model)
        evals = data.eval[:48]
        batch = demonstration_batch(tok, evals, lambda e: e.answer)
        trajs = [Trajectory(example=e, group_id=0, prompt_ids=[], response_ids=[], rollout_logprobs=[],
                            response_mask=[], finish_reason="eos") for e in evals]
        mask = batch.response_mask.bool()
        first = torch.zeros_like(mask)
        first[:, 0] = True  # the colour word's first character: r / g / b / y
        eos = batch.responses == tok.eos_token_id

        def vis(name):
            pb = perturbed_image_batch(batch, trajs, perturb=name, perturb_args={}, regions="whole", seed=0, step=0)
            st = grounding_stats(model, batch, pb, opts=ForwardOptions())
            return grounding_sensitivity(st.jsd, st.gap, batch.response_mask), st

        before, _ = vis("gaussian")
        assert before[first].mean() < 0.01  # untrained: the answer does not depend on the image
        run_sft(model, tok, data.train, data.demonstration, steps=300, batch_size=32, lr=3e-3, warmup_steps=5, seed=0)
        for name, floor in (("gaussian", 0.03), ("grey", 0.1)):
            after, st = vis(name)
            assert after[first].mean() > 10 * after[eos].mean() and after[first].mean() > floor, \
                (name, after[first].mean(), after[eos].mean())
            selected = select(st, batch.response_mask, top_fraction=0.2).selected
            assert float((selected & first).sum()) >= 0.5 * float(selected.sum())
            assert float((selected & eos).sum()) <= 0.1 * float(selected.sum())
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ config and recipe

def test_config_refuses_what_cannot_carry_images(tmp_path: Path):
    cfg = load_config("vepo_vision")
    assert cfg.model.arch == "llava" and cfg.token_select.image_perturb == "gaussian"
    assert cfg.token_select.image_perturb_args == {"std": 0.74}
    for bad, match in ((["rollout.engine=vllm"], "rollout.engine=vllm"),
                       (["train.pack=true"], "train.pack"),
                       (["model.arch=qwen2"], "task.name=shapes"),
                       (["model.vision.patch_size=5"], "model.vision.image_size"),
                       (["token_select.image_perturb=nope"], "token_select.image_perturb"),
                       (["token_select.image_perturb_args.sigma=1"], "token_select.image_perturb_args")):
        with pytest.raises(ConfigError, match=match):
            load_config("vepo_vision", bad)
    # a local LLaVA directory is a vision policy too
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(ConfigError, match="rollout.engine=vllm"):
        load_config(None, [f"model.path={tmp_path}", "rollout.engine=vllm"])
    with pytest.raises(ValueError, match="text-only model"):
        from credo.models import build_model

        expand_image_prompts(_data_text(), build_model(ModelConfig(hidden_size=16, intermediate_size=16,
                                                                   num_heads=2, num_kv_heads=1))[0])


def _data_text():
    from credo.data.source import TaskData

    ex = _examples(2)
    return TaskData("shapes", ex, ex, "shapes", None)


@pytest.mark.parametrize("extra", [
    ["token_select.type=vepo", "token_select.image_perturb=patch_blacken", "critic.enabled=true",
     "algo.kl_coef=0.1"],
    ["algo.advantage=papo", "token_select.type=entropy"],
])
def test_tiny_runs_on_the_vlm_path(tmp_path: Path, extra):
    """The recipe end to end with images: VEPO (image), a critic and a reference KL; PAPO with the entropy
    selector. Each step's metrics carry the method's keys, and the run is reproducible."""
    from credo.recipes.rlvr import train
    from credo.tracking.metrics import read_metrics

    cfg = load_config(None, VISION_RUN + ["train.steps=2"] + extra)
    rows = [r for r in read_metrics(train(cfg, run_dir=tmp_path / "a") / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2
    keys = {"vepo": ("vepo/image_changed_frac", "vepo/jsd_mean", "critic/vf_loss", "actor/kl"),
            "entropy": ("papo/phase", "token_select/frac")}[cfg.token_select.type]
    for key in keys:
        assert any(key in r for r in rows), key
    if cfg.token_select.type == "vepo":
        assert rows[0]["vepo/image_changed_frac"] == 1.0
    again = [r for r in read_metrics(train(cfg, run_dir=tmp_path / "b") / "metrics.jsonl") if r["step"] > 0]
    assert [r["reward/mean"] for r in rows] == [r["reward/mean"] for r in again]


def test_preset_trains_through_the_cli(tmp_path: Path):
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics

    run = tmp_path / "vv"
    code = main(["-q", "train", "--config", "vepo_vision", "--run-dir", str(run), *VISION_RUN[2:], "train.steps=2"])
    assert code == 0
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2 and all("vepo/image_changed_frac" in r for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and "final/eval/greedy_acc" in summary
    assert json.loads((run / "final" / "config.json").read_text())["model_type"] == "llava"
    from credo.recipes.sft import evaluate_target  # credo eval RUN: the saved LLaVA, its images from the task

    metrics = evaluate_target(run, None, ["eval.size=4"])
    assert metrics["examples"] == 4 and 0.0 <= metrics["eval/greedy_acc"] <= 1.0
