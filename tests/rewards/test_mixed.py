"""Reward mixtures, reward noise, and a trained reward model as a reward (in-process and over HTTP): hand-computed
mixtures, the noise's determinism and rate, the reward_model verifier against rm_scores, its failures, the
`credo rm serve` endpoint, config validation, and a tiny noisy CLI run whose evaluation stays clean."""
from __future__ import annotations

import json
import math
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from credo.cli.main import main
from credo.config import ConfigError, load_config
from credo.rewards import RewardRunner
from credo.rewards.mixed import MixedRunner, NoisyRunner, noise_draw
from credo.rewards.reward_model import reward_model, score_http
from credo.tracking.metrics import read_metrics
from credo.types import Example, RewardResult
from tests.conftest import TINY, TINY_RUN
from tests.env_util import free_port


class FakeRunner:
    """A runner whose result for each response is ``fn(response, example)``; records calls and close()."""

    def __init__(self, fn):
        self.fn, self.calls, self.closed = fn, 0, False

    def score(self, responses, examples):
        self.calls += 1
        return [self.fn(r, e) for r, e in zip(responses, examples)]

    def close(self):
        self.closed = True


def _examples(n: int, prefix: str = "u") -> list[Example]:
    return [Example(f"rev {i}=", str(i), uid=f"{prefix}{i}") for i in range(n)]


# -------------------------------------------------------------------------------------------------- mixture

def test_mixed_runner_weighted_sum_correct_from_the_first_and_failures():
    task = FakeRunner(lambda r, e: RewardResult(score=float(r == e.answer), correct=r == e.answer,
                                                info={"echo": r}))
    rm_scores = {"1": 0.2, "x": -0.4, "3": 0.6}

    def rm(r, e):
        if r == "3":
            return RewardResult(score=-1.0, correct=True, failed=True, error="boom")
        return RewardResult(score=rm_scores[r], correct=True)

    rm_runner = FakeRunner(rm)
    exs = [Example("p1", "1"), Example("p2", "2"), Example("p3", "3")]
    with MixedRunner([("task", 1.0, task), ("rm", 0.5, rm_runner)]) as mixed:
        out = mixed.score(["1", "x", "3"], exs)
    # scores: 1 * [1, 0, 1] + 0.5 * [0.2, -0.4, -1 (failed: the component's failure score)] = [1.1, -0.2, 0.5]
    assert [r.score for r in out] == pytest.approx([1.1, -0.2, 0.5])
    assert [r.correct for r in out] == [True, False, True]  # the task verifier's, not the reward model's
    assert [r.failed for r in out] == [False, False, True] and out[2].error == "boom"
    assert out[0].info == {"echo": "1", "components": {"task": 1.0, "rm": 0.2}}
    assert out[2].info["components"] == {"task": 1.0, "rm": -1.0}
    assert task.calls == rm_runner.calls == 1  # one batch call per component
    assert task.closed and rm_runner.closed
    # both failing: errors joined
    bad = FakeRunner(lambda r, e: RewardResult(score=0.0, failed=True, error=f"e{r}"))
    out = MixedRunner([("a", 1.0, bad), ("b", 2.0, bad)]).score(["1"], exs[:1])
    assert out[0].failed and out[0].error == "e1; e1"
    with pytest.raises(ValueError, match="at least one"):
        MixedRunner([])


def test_reward_runner_of_a_config_mixes_the_task_verifier_with_its_weight():
    from credo.recipes.common import reward_runner

    mix = "reward.mix=[{name: 'tests.reward_fixtures:length_score', weight: 0.5, executor: inline}]"
    cfg = load_config(None, ["reward.weight=2", mix])
    with reward_runner(cfg, SimpleNamespace(default_reward="exact_match")) as runner:
        assert isinstance(runner, MixedRunner)
        out = runner.score(["cba", "abcd"], [Example("rev abc=", "cba"), Example("rev dcb=", "bcd")])
    # 2 * exact_match + 0.5 * min(len, 8) / 8: [2 * 1 + 0.5 * 3/8, 2 * 0 + 0.5 * 4/8] = [2.1875, 0.25]
    assert [r.score for r in out] == pytest.approx([2.1875, 0.25])
    assert [r.correct for r in out] == [True, False]
    assert out[0].info["components"] == {"exact_match": 1.0, "tests.reward_fixtures:length_score": 0.375}


# ---------------------------------------------------------------------------------------------------- noise

def _binary(r, e):
    ok = r == e.answer
    return RewardResult(score=float(ok), correct=ok)


def test_flip_noise_at_rate_one_and_zero():
    exs = _examples(4)
    responses = ["0", "x", "2", "y"]  # clean scores [1, 0, 1, 0]
    out = NoisyRunner(FakeRunner(_binary), rate=1.0).score(responses, exs)
    assert [r.score for r in out] == [0.0, 1.0, 0.0, 1.0]  # 1 - s around center 0.5
    assert [r.correct for r in out] == [True, False, True, False]  # correct stays the verifier's
    assert all(r.info["noised"] for r in out) and [r.info["clean_score"] for r in out] == [1.0, 0.0, 1.0, 0.0]
    clean = NoisyRunner(FakeRunner(_binary), rate=0.0).score(responses, exs)
    assert clean == FakeRunner(_binary).score(responses, exs)  # nothing changed, no info added
    # another center: s -> 2c - s; c = 0: s -> -s, c = 1: 0.25 -> 1.75
    quarter = FakeRunner(lambda r, e: RewardResult(score=0.25))
    assert NoisyRunner(quarter, rate=1.0, center=0.0).score(["a"], exs[:1])[0].score == -0.25
    assert NoisyRunner(quarter, rate=1.0, center=1.0).score(["a"], exs[:1])[0].score == 1.75
    with pytest.raises(ValueError, match="flip or perturb"):
        NoisyRunner(quarter, rate=0.5, mode="swap")


def test_the_noised_set_does_not_depend_on_how_the_batch_is_split():
    # 12 prompts x 5 responses from {a, b}: many identical (uid, response) pairs, told apart by their occurrence
    exs = [ex for ex in _examples(12) for _ in range(5)]
    texts = [("a", "b")[int(noise_draw("text", i) < 0.5)] for i in range(len(exs))]
    runner = FakeRunner(_binary)

    def noised(parts: list[int], *, seed=0, step=3) -> list[bool]:
        noisy, out, start = NoisyRunner(runner, rate=0.5, seed=seed, step=step), [], 0
        for size in parts:
            out += noisy.score(texts[start:start + size], exs[start:start + size])
            start += size
        return [bool(r.info.get("noised")) for r in out]

    whole = noised([60])
    assert whole == noised([17, 43]) == noised([1] * 60)
    assert 0 < sum(whole) < 60
    # identical (uid, text) items are drawn independently (occurrence counted): some pair disagrees
    seen: dict[tuple[str, str], set[bool]] = {}
    for ex, text, flag in zip(exs, texts, whole):
        seen.setdefault((ex.uid, text), set()).add(flag)
    assert any(len(flags) == 2 for flags in seen.values())
    # another step or seed draws another set; the same (seed, step) the same set (a resumed run)
    assert noised([60], step=4) != whole and noised([60], seed=1) != whole and noised([60]) == whole


def test_perturb_noise_is_deterministic_gaussian_and_scaled_by_std():
    exs = _examples(2000)
    responses = ["r"] * 2000
    runner = FakeRunner(lambda r, e: RewardResult(score=0.5))
    one = NoisyRunner(runner, rate=1.0, mode="perturb", std=1.0, seed=7).score(responses, exs)
    again = NoisyRunner(runner, rate=1.0, mode="perturb", std=1.0, seed=7).score(responses, exs)
    two = NoisyRunner(runner, rate=1.0, mode="perturb", std=2.0, seed=7).score(responses, exs)
    other = NoisyRunner(runner, rate=1.0, mode="perturb", std=1.0, seed=8).score(responses, exs)
    d1 = [r.score - 0.5 for r in one]
    assert all(d != 0 for d in d1) and [r.score for r in again] == [r.score for r in one]
    assert [r.score - 0.5 for r in two] == pytest.approx([2 * d for d in d1])  # the same draws, twice the std
    assert [r.score for r in other] != [r.score for r in one]
    assert all(r.info["noised"] and r.info["clean_score"] == 0.5 for r in one)
    # Box-Muller from hashed uniforms: N(0, 1) over 2000 draws (sd of the mean ~0.022, of the sd ~0.016)
    assert abs(statistics.fmean(d1)) < 0.1 and abs(statistics.pstdev(d1) - 1.0) < 0.08


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.8])
def test_the_noised_share_matches_the_rate(rate):
    exs = _examples(2000)
    out = NoisyRunner(FakeRunner(_binary), rate=rate, seed=5).score(["x"] * 2000, exs)
    frac = sum(bool(r.info.get("noised")) for r in out) / 2000
    assert abs(frac - rate) < 0.03  # binomial sd <= 0.0112
    assert all(r.score == (1.0 if r.info.get("noised") else 0.0) for r in out)


def test_failed_results_are_never_noised():
    def flaky(r, e):
        return RewardResult(score=-1.0, failed=True, error="timeout") if r == "bad" else _binary(r, e)

    exs = _examples(4)
    out = NoisyRunner(FakeRunner(flaky), rate=1.0).score(["bad", "1", "bad", "x"], exs)  # [failed, 1, failed, 0]
    assert [r.score for r in out] == [-1.0, 0.0, -1.0, 1.0]
    assert [("noised" in r.info) for r in out] == [False, True, False, True]
    assert out[0].failed and out[0].error == "timeout"


# ------------------------------------------------------------------------------------ reward_model reward

PROMPTS = ["rev abc=", "rev hgfedc=", "rev ab=", "rev xyz="]
RESPONSES = ["cba", "cdefghxx", "", "zyx"]  # different lengths, one empty
EXAMPLES = [Example(p, "") for p in PROMPTS]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    """A tiny untrained reward model saved as `credo rm train` saves one (model + tokenizer), its head drawn at
    random so that scores differ between responses."""
    from credo.models import ValueModel, build_model

    model, tok = build_model(TINY, seed=0)
    rm = ValueModel.from_policy(model)
    with torch.no_grad():
        rm.value_head.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
        rm.value_head.bias.fill_(0.3)
    path = tmp_path_factory.mktemp("rm") / "reward_model"
    rm.save(path)
    tok.save_pretrained(path)
    return path


def _want(path: Path, pooling: str = "last") -> list[float]:
    from credo.models import ValueModel, load_tokenizer
    from credo.rewards.rm_scoring import response_batch, rm_scores

    rm = ValueModel.load(path).eval()
    with torch.no_grad():
        return rm_scores(rm, response_batch(load_tokenizer(path), PROMPTS, RESPONSES), pooling).tolist()


def test_reward_model_verifier_equals_rm_scores(rm_dir):
    want = _want(rm_dir)
    assert len(set(want)) == 4  # the scores tell the responses apart
    out = reward_model(RESPONSES, EXAMPLES, path=str(rm_dir))
    assert [r.score for r in out] == pytest.approx(want, abs=1e-6)
    assert [r.info["rm_score"] for r in out] == [r.score for r in out]
    assert [r.correct for r in out] == [s > 0 for s in want]
    threshold = sorted(want)[1]  # correct = raw score > threshold
    out = reward_model(RESPONSES, EXAMPLES, path=str(rm_dir), threshold=threshold)
    assert sum(r.correct for r in out) == 2
    sig = reward_model(RESPONSES, EXAMPLES, path=str(rm_dir), transform="sigmoid")
    assert [r.score for r in sig] == pytest.approx([1 / (1 + math.exp(-s)) for s in want], abs=1e-6)
    assert [r.info["rm_score"] for r in sig] == pytest.approx(want, abs=1e-6)
    mean = reward_model(RESPONSES, EXAMPLES, path=str(rm_dir), pooling="mean", batch_size=3)  # 2 forward batches
    assert [r.score for r in mean] == pytest.approx(_want(rm_dir, "mean"), abs=1e-5)
    # through the runner (a batch verifier runs in the calling process)
    with RewardRunner("reward_model", fn_kwargs={"path": str(rm_dir)}, executor="process") as runner:
        assert [r.score for r in runner.score(RESPONSES, EXAMPLES)] == pytest.approx(want, abs=1e-6)
        assert runner._workers == []


def test_reward_model_verifier_failures_are_results_not_crashes(rm_dir):
    with pytest.raises(ValueError, match="exactly one of path"):
        reward_model(RESPONSES, EXAMPLES, path=str(rm_dir), url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="transform must be raw or sigmoid"):
        reward_model(RESPONSES, EXAMPLES, path=str(rm_dir), transform="tanh")
    with RewardRunner("reward_model", fn_kwargs={"path": str(rm_dir), "url": "http://127.0.0.1:1"},
                      failure_score=-1.0) as runner:
        out = runner.score(RESPONSES, EXAMPLES)
        assert all(r.failed and r.score == -1.0 and "exactly one of path" in r.error for r in out)
        assert runner.stats["failures"] == 4
    # nobody listens: connection refused after the retries -> failed results with the error
    url = f"http://127.0.0.1:{free_port()}"
    start = time.perf_counter()
    out = reward_model(RESPONSES, EXAMPLES, url=url, retries=1, timeout_s=2)
    assert time.perf_counter() - start < 5
    assert all(r.failed and r.score == 0.0 and "URLError" in r.error for r in out)
    with RewardRunner("reward_model", fn_kwargs={"url": url, "retries": 0}, failure_score=-2.0) as runner:
        assert [r.score for r in runner.score(RESPONSES, EXAMPLES)] == [-2.0] * 4
    # not a saved model: failed results too (FileNotFoundError is an OSError)
    out = reward_model(RESPONSES[:1], EXAMPLES[:1], path=str(rm_dir.parent / "nothing"))
    assert out[0].failed and "not a saved reward model" in out[0].error


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_rm_serve_endpoint_gives_the_local_scores(rm_dir, monkeypatch):
    """`credo rm serve PATH --port P` (uvicorn in a thread of this process): /health, /score equal to the local
    model's scores (score_http and the verifier with url=), 422 on mismatched lengths."""
    import uvicorn

    servers: list = []

    def run_in_thread(app, **kwargs):
        servers.append(uvicorn.Server(uvicorn.Config(app, **kwargs)))
        servers[-1].run()

    monkeypatch.setattr(uvicorn, "run", run_in_thread)
    port = free_port()
    thread = threading.Thread(target=main, args=(["rm", "serve", str(rm_dir), "--port", str(port)],), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                    assert json.loads(resp.read()) == {"ok": True, "path": str(rm_dir)}
                break
            except OSError:
                assert time.time() < deadline and thread.is_alive(), "credo rm serve did not start"
                time.sleep(0.05)
        want = reward_model(RESPONSES, EXAMPLES, path=str(rm_dir))
        assert score_http(url, PROMPTS, RESPONSES) == pytest.approx([r.score for r in want], abs=1e-6)
        remote = reward_model(RESPONSES, EXAMPLES, url=url + "/", transform="sigmoid")
        local = reward_model(RESPONSES, EXAMPLES, path=str(rm_dir), transform="sigmoid")
        assert [r.score for r in remote] == pytest.approx([r.score for r in local], abs=1e-6)
        assert [r.correct for r in remote] == [r.correct for r in local] and not any(r.failed for r in remote)
        status, body = _post(url + "/score", {"prompts": PROMPTS, "responses": RESPONSES[:3]})
        assert status == 422 and "differ in length" in body["detail"]
        assert _post(url + "/score", {"prompts": PROMPTS})[0] == 422  # responses missing
        assert _post(url + "/score", {"prompts": ["a"], "responses": [1]})[0] == 422
        assert _post(url + "/score", {"prompts": [], "responses": []}) == (200, {"scores": []})
    finally:
        if servers:
            servers[-1].should_exit = True
        thread.join(timeout=10)
    assert not thread.is_alive()


# --------------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("overrides,match", [
    (["reward.mix=[{name: reward_modle, kwargs: {path: x}}]"], r"reward.mix\[0\].name: unknown reward.*reward_model"),
    (["reward.mix=[reward_model]"], r"reward.mix\[0\]: expected \{name: VERIFIER"),
    (["reward.mix=[{name: exact_match, wieght: 1}]"], r"reward.mix\[0\]: expected"),
    (["reward.mix=[{name: exact_match, weight: heavy}]"], "weight must be a number"),
    (["reward.mix=[{name: exact_match, kwargs: [1]}]"], "kwargs a mapping"),
    (["reward.mix=[{name: exact_match}]", "distributed.backend=ray"], "reward.mix: not implemented with distributed"),
    (["reward.noise=0.2", "agent.envs=[calc]"], "reward.noise: single-turn tasks only"),
    (["reward.noise=1.5"], r"reward.noise: must be <= 1.0"),
    (["reward.noise_mode=swap"], "reward.noise_mode"),
])
def test_reward_mix_and_noise_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def test_reward_mix_and_noise_configs_load():
    cfg = load_config(None, ["reward.mix=[{name: reward_model, weight: 0.5, kwargs: {path: /nowhere}}]",
                             "reward.weight=2", "reward.noise=0.3", "reward.noise_mode=perturb", "reward.noise_std=0.2"])
    assert cfg.reward.mix == [{"name": "reward_model", "weight": 0.5, "kwargs": {"path": "/nowhere"}}]
    assert (cfg.reward.weight, cfg.reward.noise, cfg.reward.noise_mode) == (2.0, 0.3, "perturb")


# ------------------------------------------------------------------------------------------------- CLI run

def test_noisy_training_rewards_clean_evaluation(tmp_path: Path):
    """reward.noise=0.5 on reversal (exact_match, 0/1): the logged share of noised rewards is exactly the share of
    training samples whose score disagrees with their verified correctness; evaluation scores stay clean."""
    run = tmp_path / "noisy"
    assert main(["-q", "train", "--run-dir", str(run), *TINY_RUN, "train.steps=2", "eval.every=1", "reward.noise=0.5",
                 "log.rollouts_every=1", "log.report=false", "log.tensorboard=false", "log.progress=false"]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "reward/noised_frac" not in rows[0] and "eval/greedy_acc" in rows[0]  # step 0: evaluation only
    samples = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    for r in rows[1:]:
        step = [s for s in samples if s["step"] == r["step"]]
        assert len(step) == 16
        flipped = sum(s["score"] != float(s["correct"]) for s in step)  # flip: 1 - s on a 0/1 reward
        assert 0 < r["reward/noised_frac"] < 1 and r["reward/noised_frac"] == flipped / 16
        assert r["reward/mean"] == pytest.approx(sum(s["score"] for s in step) / 16)
    for r in rows:  # the evaluation's 0/1 rewards agree with its correctness: no noise there
        assert r["eval/reward_mean"] == pytest.approx(r["eval/avg@2"])
    for path in sorted((run / "eval_samples").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            s = json.loads(line)
            assert s["score"] == float(s["correct"])
