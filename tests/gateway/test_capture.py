"""Stitching an episode's calls into trajectories (credo.gateway.capture), on hand-built calls."""
from __future__ import annotations

import pytest

from credo.gateway.capture import CallRecord, EpisodeRecord, stitch


def call(prompt, completion, logprobs=None):
    return CallRecord(prompt_ids=prompt, completion_ids=completion,
                      logprobs=logprobs if logprobs is not None else [-1.0] * len(completion),
                      finish_reason="stop", text="")


def test_a_call_that_extends_the_context_joins_its_segment_with_the_inserted_ids_masked():
    a = call([1, 2, 3], [4, 5], [-0.1, -0.2])
    b = call([1, 2, 3, 4, 5, 6, 7], [8], [-0.3])  # inserted between: 6, 7 (a tool message, say)
    [seg] = stitch([a, b])
    assert seg.prompt_ids == [1, 2, 3]
    assert seg.response_ids == [4, 5, 6, 7, 8]
    assert seg.response_mask == [1, 1, 0, 0, 1]
    assert seg.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert seg.calls == [0, 1] and seg.reason == "first call"


def test_a_call_that_extends_with_nothing_inserted():
    [seg] = stitch([call([1], [2]), call([1, 2], [3])])
    assert seg.response_ids == [2, 3] and seg.response_mask == [1, 1]


def test_a_call_that_diverges_starts_a_second_segment_and_says_where():
    a = call([1, 2, 3], [4, 5])
    b = call([1, 2, 3, 4, 9, 6], [7])  # the agent sent back another token at position 4 (0-based)
    s0, s1 = stitch([a, b])
    assert (s0.calls, s1.calls) == ([0], [1])
    assert s1.prompt_ids == [1, 2, 3, 4, 9, 6] and s1.response_ids == [7] and s1.response_mask == [1]
    assert "call 1" in s1.reason and "segment 0" in s1.reason and "at token 4" in s1.reason
    assert (s0.split, s1.split) == ("", "diverged")


def test_two_calls_on_the_same_context_cannot_share_it():
    a = call([1, 2], [3])
    b = call([1, 2, 3, 4], [5])  # extends a: segment 0 is now [1, 2, 3, 4, 5]
    c = call([1, 2, 3, 6], [7])  # extends a's context but not b's: differs from segment 0 at token 3
    d = call([1, 2], [8])  # a's prompt resent
    segs = stitch([a, b, c, d])
    assert [s.calls for s in segs] == [[0, 1], [2], [3]]
    assert "at token 3" in segs[1].reason
    assert "is a prefix of segment 1" in segs[2].reason  # ties (2 shared tokens with both): the latest segment
    assert [s.split for s in segs] == ["", "diverged", "branched"]


def test_a_call_joins_the_longest_segment_it_extends():
    a = call([1], [2])  # segment 0: [1, 2]
    b = call([5], [6])  # segment 1: [5, 6]
    c = call([5, 6, 7], [8])  # extends segment 1 only
    segs = stitch([a, b, c])
    assert [s.calls for s in segs] == [[0], [1, 2]]
    assert segs[1].response_mask == [1, 0, 1]


def test_logprobs_must_match_the_completion():
    with pytest.raises(ValueError, match="2 completion ids but 1 log-probs"):
        stitch([call([1], [2, 3], [-1.0])])


def test_episode_summary_counts_segments_and_splits():
    rec = EpisodeRecord(key="k", calls=[call([1], [2]), call([1, 2, 3], [4]), call([9], [9, 9])],
                        refused=["episode_limit: ..."])
    s = rec.summary()
    # tokens: prompts 1 + 3 + 1 = 5, completions 1 + 1 + 2 = 4
    assert s["calls"] == 3 and s["refused"] == 1 and s["segments"] == 2
    assert s["prompt_tokens"] == 5 and s["completion_tokens"] == 4
    assert len(s["splits"]) == 1 and s["splits"][0].startswith("call 2:") and s["split_kinds"] == ["diverged"]
