"""Rollout collection: group filtering, DAPO dynamic sampling, overlong shaping (with stub engine and verifier)."""
from __future__ import annotations

import pytest

from credo.data import PromptSampler
from credo.rewards.shaping import overlong_penalty
from credo.collect.group import collect_rollouts
from credo.types import Example, RewardResult, SamplingParams, Trajectory


class StubEngine:
    """Prompt 'p<i>' answers with the scripted responses for i (one per sample)."""

    def __init__(self, script):
        self.script = script

    def generate(self, prompts, n, sampling, on_done=None):  # never streams: results() scores everything
        out = []
        for g, ex in enumerate(prompts):
            for text in self.script[ex.prompt][:n]:
                out.append(Trajectory(example=ex, group_id=g, prompt_ids=[1], response_ids=[5] * len(text),
                                      rollout_logprobs=[0.0] * len(text), response_mask=[1] * len(text),
                                      finish_reason="eos", response_text=text))
        return out


class StubRunner:
    def score(self, responses, examples):
        return [RewardResult(score=float(r == "ok"), correct=r == "ok") for r in responses]


SCRIPT = {"p0": ["ok", "no"], "p1": ["no", "no"], "p2": ["ok", "ok"], "p3": ["no", "ok"]}


def _sampler():
    return PromptSampler([Example(p, "ok") for p in SCRIPT], seed=0, shuffle=False)


def test_no_filtering_keeps_everything():
    r = collect_rollouts(StubEngine(SCRIPT), StubRunner(), _sampler(), prompts_per_step=4, group_size=2,
                         sampling=SamplingParams())
    assert len(r.trajs) == 8 and r.metrics["filter/kept_groups"] == 4 and r.metrics["filter/gen_batches"] == 1


def test_filter_drops_all_equal_groups_and_renumbers():
    r = collect_rollouts(StubEngine(SCRIPT), StubRunner(), _sampler(), prompts_per_step=4, group_size=2,
                         sampling=SamplingParams(), filter_groups=True)
    assert sorted({t.example.prompt for t in r.trajs}) == ["p0", "p3"]  # p1 all 0, p2 all 1
    assert [t.group_id for t in r.trajs] == [0, 0, 1, 1]
    assert r.metrics["filter/dropped_groups"] == 2
    assert r.metrics["reward/mean"] == pytest.approx(4 / 8)  # reward metrics describe everything generated


def test_dynamic_sampling_refills_up_to_the_cap():
    # 2 prompts per step; round 1 draws p0, p1 (1 informative), round 2 draws p2, p3 (1 more) -> full
    r = collect_rollouts(StubEngine(SCRIPT), StubRunner(), _sampler(), prompts_per_step=2, group_size=2,
                         sampling=SamplingParams(), filter_groups=True, dynamic_sampling=True, max_gen_batches=3)
    assert r.metrics["filter/gen_batches"] == 2 and r.metrics["filter/kept_groups"] == 2
    assert sorted({t.example.prompt for t in r.trajs}) == ["p0", "p3"]
    # with a cap of 1 round the short batch is trained as it is
    r = collect_rollouts(StubEngine(SCRIPT), StubRunner(), _sampler(), prompts_per_step=2, group_size=2,
                         sampling=SamplingParams(), filter_groups=True, dynamic_sampling=True, max_gen_batches=1)
    assert r.metrics["filter/gen_batches"] == 1 and r.metrics["filter/kept_groups"] == 1


def test_overlong_penalty_values_and_shaping():
    # max 12, buffer 2: no penalty up to 10 tokens, -0.5 at 11, -1.0 at 12 (factor 1)
    assert overlong_penalty(10, max_len=12, buffer=2) == 0.0
    assert overlong_penalty(11, max_len=12, buffer=2) == pytest.approx(-0.5)
    assert overlong_penalty(12, max_len=12, buffer=2, factor=2.0) == pytest.approx(-2.0)
    assert overlong_penalty(12, max_len=12, buffer=0) == 0.0
    script = {"p0": ["ok", "nonono"], "p1": ["no", "no"], "p2": ["ok", "ok"], "p3": ["no", "ok"]}
    r = collect_rollouts(StubEngine(script), StubRunner(), _sampler(), prompts_per_step=1, group_size=2,
                         sampling=SamplingParams(max_new_tokens=6), overlong_buffer=2, overlong_factor=1.0)
    # "nonono" has 6 tokens = the cap -> score 0 - 1 = -1; "ok" has 2 tokens -> no penalty
    assert [res.score for res in r.results] == [1.0, -1.0]
    assert r.metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.5)


def test_rewards_are_computed_while_generation_is_still_running():
    """The engine reports its first quarter of outputs done (the scorer's batch: 2 of 8), then waits (up to
    10 s) until the verifier has been called: only a scorer that runs concurrently with generation lets it go
    on before the timeout."""
    import threading

    scored_early = threading.Event()

    class WaitingRunner(StubRunner):
        def __init__(self):
            self.calls = []

        def score(self, responses, examples):
            self.calls.append(list(responses))
            scored_early.set()
            return super().score(responses, examples)

    class StreamingEngine(StubEngine):
        def generate(self, prompts, n, sampling, on_done=None):
            out = super().generate(prompts, n, sampling)
            self.first = [t.response_text for t in out[:2]]
            on_done(0, out[0])
            on_done(1, out[1])
            self.overlapped = scored_early.wait(timeout=10)
            for i, t in enumerate(out[2:], start=2):
                on_done(i, t)
            return out

    engine, runner = StreamingEngine(SCRIPT), WaitingRunner()
    r = collect_rollouts(engine, runner, _sampler(), prompts_per_step=4, group_size=2, sampling=SamplingParams())
    assert engine.overlapped
    assert runner.calls[0] == engine.first and sum(len(c) for c in runner.calls) == 8  # each output scored once
    assert [x.score for x in r.results] == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]


def test_a_failing_scorer_thread_surfaces_its_error():
    class Broken(StubRunner):
        def score(self, responses, examples):
            raise RuntimeError("verifier pool died")

    class StreamingEngine(StubEngine):
        def generate(self, prompts, n, sampling, on_done=None):
            out = super().generate(prompts, n, sampling)
            for i, t in enumerate(out):
                on_done(i, t)
            return out

    with pytest.raises(RuntimeError, match="verifier pool died"):
        collect_rollouts(StreamingEngine(SCRIPT), Broken(), _sampler(), prompts_per_step=4, group_size=2,
                         sampling=SamplingParams())
