"""What the gateway records of an episode, and the stitching of its calls into trajectories
(docs/bring-your-own.md, "token-exact capture").

Every call the gateway answered is a :class:`CallRecord`: the prompt ids the engine was given (the rendered
conversation, with earlier completions' sampled ids substituted where the agent sent them back:
:mod:`credo.gateway.render`), the completion ids and sampler log-probs exactly as the engine's token-level API
returned them. Nothing the agent sends is re-tokenised into a completion.

:func:`stitch` turns an episode's calls into :class:`Segment`\\ s, each one trajectory::

    prompt_ids   = call a's prompt ids
    response_ids = [call a's completion] [ids inserted before call b] [call b's completion] ...
    response_mask =       1 ...                    0 ...                       1 ...
    logprobs      = sampler's log-probs            0.0                  sampler's log-probs

Call b joins the segment of call a when b's prompt ids start with the segment's whole ids (prompt + response so
far), token for token; the ids after them (the template's tail after a turn, tool messages, the next assistant
prefix) are the inserted ones. A call that extends no segment starts a new one; its :attr:`Segment.reason` says
why (the call it diverged from, and at which token). The segments of an episode share its reward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CallRecord:
    """One answered call of an episode (``/v1/chat/completions`` or ``/v1/completions``)."""

    prompt_ids: list[int]  # what the engine was given
    completion_ids: list[int]  # what the engine sampled (the end-of-turn / EOS token included when it stopped there)
    logprobs: list[float]  # the sampler's log-prob of each completion id (run temperature, unfiltered)
    finish_reason: str  # as answered: "stop" | "length" | "tool_calls"
    text: str  # the decoded completion (special tokens skipped; tool-call markup kept; a stop string cut off)
    tool_calls: list[dict] = field(default_factory=list)  # as answered (OpenAI format; arguments a JSON string)
    messages: list[dict] = field(default_factory=list)  # the request's messages ([] for /v1/completions)
    endpoint: str = "chat.completions"  # "chat.completions" | "completions"
    content: str | None = None  # the answered message content (text outside the tool calls)
    tools: list[dict] = field(default_factory=list)  # the tools the request offered (after tool_choice "none": [])
    reused_call: int | None = None  # index of the earlier call whose sampled ids were substituted (render.py)
    policy_version: int | None = None  # the engine's policy version when the call was answered
    latency_s: float = 0.0  # from the request's arrival to its answer


@dataclass
class EpisodeRecord:
    """An episode's calls in the order they were answered, and the calls it refused."""

    key: str
    calls: list[CallRecord] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line each: "<code>: <message>"
    episode_id: str = ""
    closed: bool = False

    def segments(self) -> list["Segment"]:
        return stitch(self.calls)

    def summary(self) -> dict[str, Any]:
        """Counts for metrics: calls, refused calls, segments, prompt / completion tokens, the split reasons and
        their kinds ("branched" / "diverged", :func:`stitch`)."""
        segs = self.segments()
        return {"calls": len(self.calls), "refused": len(self.refused), "segments": len(segs),
                "prompt_tokens": sum(len(c.prompt_ids) for c in self.calls),
                "completion_tokens": sum(len(c.completion_ids) for c in self.calls),
                "splits": [s.reason for s in segs[1:]], "split_kinds": [s.split for s in segs[1:]]}


@dataclass
class Segment:
    """One trajectory stitched from calls (module docstring)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 on sampled tokens, 0 on inserted ones
    logprobs: list[float] = field(default_factory=list)  # 0.0 where the mask is 0
    calls: list[int] = field(default_factory=list)  # indices of the calls in it, in order
    reason: str = "first call"  # why this segment starts (a split's reason for every segment after the first)
    split: str = ""  # the kind of split that started it: "" (the first segment), "branched" or "diverged"

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def _extend(self, index: int, call: CallRecord) -> None:
        inserted = call.prompt_ids[len(self.prompt_ids) + len(self.response_ids):]
        self.response_ids += inserted + list(call.completion_ids)
        self.response_mask += [0] * len(inserted) + [1] * len(call.completion_ids)
        self.logprobs += [0.0] * len(inserted) + [float(x) for x in call.logprobs]
        self.calls.append(index)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def stitch(calls: list[CallRecord]) -> list[Segment]:
    """The episode's calls as trajectories (module docstring). Call i joins the segment whose ids (prompt +
    response so far) its prompt ids extend, the longest when several do; otherwise it starts a segment, whose
    ``reason`` names the segment it came closest to and where the ids first differ. Two calls extending the same
    context (an agent that branches, or resends one prompt) cannot both join it: the second starts a segment."""
    segments: list[Segment] = []
    for i, call in enumerate(calls):
        if len(call.logprobs) != len(call.completion_ids):
            raise ValueError(f"call {i}: {len(call.completion_ids)} completion ids but {len(call.logprobs)} "
                             "log-probs")
        prompt = list(call.prompt_ids)
        best, best_len = None, -1
        for seg in segments:
            ids = seg.ids
            if len(ids) <= len(prompt) and prompt[:len(ids)] == ids and len(ids) > best_len:
                best, best_len = seg, len(ids)
        if best is not None:
            best._extend(i, call)
            continue
        reason, kind = _split_reason(i, prompt, segments)
        seg = Segment(prompt_ids=prompt, reason=reason, split=kind)
        seg._extend(i, call)
        segments.append(seg)
    return segments


def _split_reason(index: int, prompt: list[int], segments: list[Segment]) -> tuple[str, str]:
    """(why call ``index`` starts a new segment, the split's kind): "first call" and "" for the first segment;
    "branched" when its prompt is a prefix of a segment's ids (the agent resent or branched from an earlier
    context); "diverged" when its prompt differs from every segment's ids at some token (the conversation was not
    sent back as the engine produced it). The segment named is the one sharing the most leading ids (the latest
    on a tie)."""
    if not segments:
        return "first call", ""
    n, j = max((_common_prefix(prompt, s.ids), j) for j, s in enumerate(segments))
    seg = segments[j]
    total = len(seg.ids)
    if n == len(prompt):
        return (f"call {index}: its prompt ({len(prompt)} tokens) is a prefix of segment {j} (calls {seg.calls}, "
                f"{total} tokens): the agent resent or branched from an earlier context", "branched")
    return (f"call {index}: its prompt differs from segment {j} (calls {seg.calls}, {total} tokens) at token {n} "
            f"(of {len(prompt)}): the conversation after call {seg.calls[-1]} was not sent back as the engine "
            "produced it", "diverged")
