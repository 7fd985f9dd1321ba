"""AgentV-RL's agentic verifier, the scoring side (docs/agentic_verifier.md).

A verifier policy reads a (problem, candidate solution) pair, plans (``<subtasks>``), checks sub-claims with
sandboxed Python (``<python>``, at most 3 calls) and ends with ``<answer>true|false</answer>``; the episode is
the ``verify`` environment (:mod:`credo.methods.agentic_verifier.env`). This module holds:

- the RL reward of a verification transcript (:func:`verifier_reward`, :func:`multistage_reward`): +1 if the
  verdict matches the ground-truth correctness label, -1 if wrong or missing (or, ``require_plan=True``, the
  reference's bool-reward variant, if the verdict does not come after a ``<subtasks>`` block), 0 if the label is
  unknown;
- the verifier score (:func:`verdict_probability`, the reference's ``BoolLogitsScorer``): P(true) from the two
  logits at the verdict position, softmax over the pair; :func:`verdict_logits` reads them off a model's
  next-token logits;
- best-of-N aggregation: :func:`combine` (0.7 s_fwd + 0.3 s_bwd), :func:`final_verdict` (true only if both
  agents say true), :func:`best_of_n`;
- :class:`AgenticVerifier`: runs the forward and the backward episodes of a verifier policy with credo's agent
  loop (:class:`~credo.rollout.agent_loop.AgentLoop`) and reads P(true) from the policy's logits;
- the batch reward ``agentic_verifier`` (``reward.name=agentic_verifier reward.kwargs.model_path=DIR``): a
  saved verifier policy's combined score as the reward of another policy's responses.

The pure functions import nothing heavy; torch and the models are imported only by :class:`AgenticVerifier`
(reward worker processes must start fast).
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from credo.methods.agentic_verifier.verdict import outcome_reward, parse_label, parse_verdict
from credo.rewards.registry import register_reward
from credo.types import Example, RewardResult

__all__ = [
    "DEFAULT_W_FWD",
    "AgenticVerifier",
    "VerifierEpisode",
    "agentic_verifier_reward",
    "best_of_n",
    "combine",
    "final_verdict",
    "multistage_reward",
    "parse_label",
    "parse_verdict",
    "verdict_logits",
    "verdict_probability",
    "verdict_token_ids",
    "verifier_reward",
]

DEFAULT_W_FWD = 0.7  # best-of-N weight of the forward agent (the backward agent gets 1 - w_fwd)
PLAN_FORMAT_SCORE = 0.2  # multistage plan stage: the format part of 2 (format + plan_score - 0.5)
GLOBAL_BONUS = 0.2  # multistage subtask stage: weight of the global verdict's correctness

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SUBTASKS = re.compile(r"<subtasks>(.*?)</subtasks>", re.DOTALL)


def _final_answer(text: str, *, require_plan: bool) -> tuple[bool, str | None]:
    """(plan ok, body of the last ``<answer>``) as the reference finds them (``find_tags(...)[-1]``)."""
    answers = list(_ANSWER.finditer(text))
    if not require_plan:
        return True, answers[-1].group(1) if answers else None
    plans = list(_SUBTASKS.finditer(text))
    if not plans:
        return False, None
    if answers and answers[-1].start() >= plans[-1].end():
        return True, answers[-1].group(1)
    return True, None


# ----------------------------------------------------------------------------------------------- rewards

def verifier_reward(text: str, label: Any, *, require_plan: bool = False) -> float:
    """The RL reward of a verification transcript (reference ``agent_verifier*.py``).

    +1 if the last ``<answer>`` verdict matches ``label``; -1 if it is wrong, unparseable or missing; with
    ``require_plan`` (the bool-reward variant, ``compute_bool_reward``) also -1 when the transcript has no
    ``<subtasks>`` block or its last ``<answer>`` does not start after the last ``<subtasks>`` block ends; 0 if
    ``label`` is unknown (neither a bool nor true/false text) and the format checks passed.
    """
    plan_ok, body = _final_answer(text, require_plan=require_plan)
    return outcome_reward(body, label) if plan_ok else -1.0


def multistage_reward(text: str, label: Any, *, stage: str | None = None, plan_score: float = 0.0,
                      subtask_label: Any = None) -> float:
    """The reference's multistage variant (``compute_agentic_reward_multistage``).

    - ``stage=None``: :func:`verifier_reward` with ``require_plan=True`` (the bool reward);
    - ``"plan"``: ``2 (format + plan_score - 0.5)`` with format 0.2 when the text holds a non-empty
      ``<subtasks>`` block, else 0 ([derived]: the reference's format check is that the plan parses as JSON);
      ``plan_score`` is the externally judged plan quality;
    - ``"subtask"``: correctness of the sub-verdict against ``subtask_label`` (+1 / -1 / 0), plus
      ``0.2 x`` the global correctness against ``label`` when that is positive (as the reference adds it only
      for ``global > 0``);
    - ``"review"``: correctness against ``label``.
    """
    if stage is None:
        return verifier_reward(text, label, require_plan=True)
    if stage == "plan":
        fmt = PLAN_FORMAT_SCORE if any(m.group(1).strip() for m in _SUBTASKS.finditer(text)) else 0.0
        return 2.0 * (fmt + float(plan_score) - 0.5)
    if stage == "subtask":
        score = verifier_reward(text, subtask_label)
        global_score = verifier_reward(text, label)
        return score + GLOBAL_BONUS * global_score if global_score > 0 else score
    if stage == "review":
        return verifier_reward(text, label)
    raise ValueError(f"multistage_reward: unknown stage {stage!r} (expected None, 'plan', 'subtask' or 'review')")


# ----------------------------------------------------------------------------------------------- scoring

def verdict_probability(logits_true: float, logits_false: float) -> float:
    """P(true) from the logits of the "true" and "false" tokens: softmax over the pair,
    ``1 / (1 + exp(l_false - l_true))`` (the reference's ``BoolLogitsScorer``: p_true / (p_true + p_false),
    which is the same number since the full softmax's normaliser cancels)."""
    d = float(logits_false) - float(logits_true)
    if d >= 0:
        e = math.exp(-d)
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(d))


def verdict_token_ids(tokenizer) -> tuple[int, int]:
    """Token ids whose logits stand for the verdicts: the first token of ``true`` and of ``false`` ([derived]: the
    reference scores the label strings; with credo's character tokenizer they are ``t`` and ``f``, with a BPE
    tokenizer usually the whole words)."""
    t = list(tokenizer("true", add_special_tokens=False)["input_ids"])
    f = list(tokenizer("false", add_special_tokens=False)["input_ids"])
    if not t or not f or t[0] == f[0]:
        raise ValueError("the tokenizer gives 'true' and 'false' the same first token; cannot score verdicts")
    return t[0], f[0]


def verdict_logits(next_token_logits, true_id: int, false_id: int) -> tuple[float, float]:
    """(logit of "true", logit of "false") from a model's next-token logits at the verdict position (the position
    right after ``<answer>``): a (V,) vector, or (..., V) whose last row is that position."""
    row = next_token_logits
    while getattr(row, "ndim", 1) > 1:
        row = row[-1]
    return float(row[true_id]), float(row[false_id])


def combine(s_fwd: float, s_bwd: float, w_fwd: float = DEFAULT_W_FWD) -> float:
    """Best-of-N score: ``w_fwd s_fwd + (1 - w_fwd) s_bwd`` (0.7 / 0.3 by default)."""
    return float(w_fwd) * float(s_fwd) + (1.0 - float(w_fwd)) * float(s_bwd)


def final_verdict(fwd: bool | None, bwd: bool | None) -> bool:
    """True only if both the forward and the backward agent say true."""
    return fwd is True and bwd is True


def best_of_n(verifier, problem: str, candidates: Sequence[str]) -> int:
    """Index of the candidate with the highest combined score (the first one on ties). ``verifier`` is an
    :class:`AgenticVerifier` (or anything with ``score_batch(problems, candidates) -> list[RewardResult]``)."""
    if not candidates:
        raise ValueError("best_of_n: no candidates")
    results = verifier.score_batch([problem] * len(candidates), list(candidates))
    scores = [r.score for r in results]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


# ----------------------------------------------------------------------------------------------- the verifier

@dataclass
class VerifierEpisode:
    """One verification episode's outcome."""

    mode: str
    verdict: bool | None  # the parsed <answer>, None if missing or unparseable
    score: float  # P(true) at the verdict token; 0.0 when there is no verdict
    logits: tuple[float, float] | None  # (true, false) logits at the verdict position
    turns: int
    tool_calls: int
    cut: str
    transcript: str


class AgenticVerifier:
    """A verifier policy (HF model + tokenizer, e.g. ``credo train agent.envs=[verify]``'s ``final/``) that scores
    (problem, candidate) pairs by a forward and a backward verification episode.

    Episodes run on credo's agent loop against ``verify`` environments loaded with the given pair (the same
    instruction, observation and action protocol as in training), greedy by default (temperature 0) or with
    ``sampling``. Each episode's score is P(true) read from the policy's logits right after the ``<answer>`` tag
    of its verdict turn (0 if the episode gave no verdict); the result is ``combine(s_fwd, s_bwd, w_fwd)`` with
    both verdicts, ``final_verdict`` and the episodes in ``info``.
    """

    def __init__(self, model, tokenizer, *, w_fwd: float = DEFAULT_W_FWD, sampling=None, seed: int = 0,
                 max_turns: int = 6, max_tokens_per_turn: int = 48, max_response_tokens: int = 384,
                 template: str = "auto", stop_at_action: bool = False, env_params: dict | None = None,
                 threads: int = 4):
        from credo.envs import get_env_spec
        from credo.rollout.agent_loop import AgentLoop, chat_template, plain_template
        from credo.rollout.hf import HFRolloutEngine
        from credo.types import SamplingParams

        if template == "auto":
            template = "chat" if getattr(tokenizer, "chat_template", None) else "plain"
        if template not in ("plain", "chat"):
            raise ValueError(f"template must be auto, plain or chat, got {template!r}")
        self.model, self.tokenizer, self.w_fwd = model, tokenizer, float(w_fwd)
        self.sampling = sampling if sampling is not None else SamplingParams(greedy=True)
        self.env_params = dict(env_params or {})
        self.true_id, self.false_id = verdict_token_ids(tokenizer)
        stops = ()
        if stop_at_action:
            tags = get_env_spec("verify").parser.tags
            stops = tuple(tuple(tokenizer(f"</{t}>", add_special_tokens=False)["input_ids"]) for t in tags)
        self.engine = HFRolloutEngine(model, tokenizer, seed=seed)
        self.loop = AgentLoop(self.engine, tokenizer, chat_template(tokenizer) if template == "chat"
                              else plain_template(tokenizer), max_turns=max_turns,
                              max_tokens_per_turn=max_tokens_per_turn, max_response_tokens=max_response_tokens,
                              threads=threads, stop_sequences=stops,
                              max_total_tokens=getattr(model.config, "max_position_embeddings", None),
                              kv_reuse=self.engine.kv_sessions)

    # -------------------------------------------------------------------------- public API
    def score(self, problem: str, candidate: str) -> RewardResult:
        return self.score_batch([problem], [candidate])[0]

    def score_batch(self, problems: Sequence[str], candidates: Sequence[str]) -> list[RewardResult]:
        """Both episodes of every pair, run in one lockstep batch (2 N episodes)."""
        if len(problems) != len(candidates):
            raise ValueError(f"{len(problems)} problems but {len(candidates)} candidates")
        episodes = self.run_episodes([(p, c, m) for p, c in zip(problems, candidates) for m in ("forward", "backward")])
        out = []
        for i in range(len(problems)):
            fwd, bwd = episodes[2 * i], episodes[2 * i + 1]
            verdict = final_verdict(fwd.verdict, bwd.verdict)
            info = {"forward": _episode_info(fwd), "backward": _episode_info(bwd), "verdict": verdict,
                    "s_fwd": fwd.score, "s_bwd": bwd.score, "w_fwd": self.w_fwd}
            out.append(RewardResult(score=combine(fwd.score, bwd.score, self.w_fwd), correct=verdict, info=info))
        return out

    def run_episodes(self, cases: Sequence[tuple[str, str, str]]) -> list[VerifierEpisode]:
        """One episode per (problem, candidate, mode) on the agent loop; P(true) read at each verdict."""
        from credo.methods.agentic_verifier.env import CaseClient, VerifyCase

        clients = [CaseClient(VerifyCase(problem=p, candidate=c, mode=m), **self.env_params) for p, c, m in cases]
        examples = [Example(prompt=f"verify:{i}", answer="", uid=f"verify/score/{i}",
                            meta={"env": "verify", "task_id": i}) for i in range(len(cases))]
        try:
            eps = self.loop.run(examples, clients, list(range(len(cases))), self.sampling)
        finally:
            for c in clients:
                c.close()
        out = []
        for (_, _, mode), ep, client in zip(cases, eps, clients):
            verdict = client.env.verdict if client.env.answered else None
            logits = self._verdict_logits(ep) if verdict is not None else None
            score = verdict_probability(*logits) if logits is not None else 0.0
            out.append(VerifierEpisode(mode=mode, verdict=verdict, score=score, logits=logits, turns=len(ep.turns),
                                       tool_calls=ep.tool_calls, cut=ep.cut or ep.env_failure,
                                       transcript=self.tokenizer.decode(ep.response_ids, skip_special_tokens=True)))
        return out

    # -------------------------------------------------------------------------- internals
    def _verdict_logits(self, ep) -> tuple[float, float] | None:
        """Logits of true / false right after the ``<answer>`` tag of the verdict turn (the last one): the context
        is the episode's own token ids up to that turn plus the turn's text up to and including ``<answer>``."""
        import torch

        if not ep.turns:
            return None
        start, end = ep.turns[-1]
        ids = ep.response_ids[start:end]
        if ids and ids[-1] == self.loop.template.end_of_turn:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        m = _ANSWER.search(text)
        if m is None:
            return None
        head = text[:m.start()] + "<answer>"
        context = ep.prompt_ids + ep.response_ids[:start] + list(self.tokenizer(head, add_special_tokens=False)
                                                                 ["input_ids"])
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([context], device=device)).logits[0, -1].float().cpu()
        finally:
            self.model.train(was_training)
        return verdict_logits(logits, self.true_id, self.false_id)


def _episode_info(ep: VerifierEpisode) -> dict[str, Any]:
    return {"verdict": ep.verdict, "score": ep.score, "turns": ep.turns, "tool_calls": ep.tool_calls, "cut": ep.cut,
            "transcript": ep.transcript[-2000:]}


# ----------------------------------------------------------------------------------------------- batch reward

_LOADED: dict[tuple, Any] = {}
_LOAD_LOCK = threading.Lock()


def _load_verifier_model(model_path: str, device: str, dtype: str):
    """The verifier policy at ``model_path``, loaded once per process (frozen: eval mode, no gradients)."""
    key = (str(model_path), device, dtype)
    with _LOAD_LOCK:
        if key not in _LOADED:
            from credo.config.schema import ModelConfig
            from credo.models.build import load_model

            model, tok = load_model(model_path, ModelConfig(path=str(model_path), device=device, dtype=dtype))
            model.eval().requires_grad_(False)
            _LOADED[key] = (model, tok)
        return _LOADED[key]


@register_reward("agentic_verifier", batch=True)
def agentic_verifier_reward(responses: list[str], examples: list[Example], *, model_path: str | None = None,
                            w_fwd: float = DEFAULT_W_FWD, temperature: float = 0.0, top_p: float = 1.0,
                            top_k: int = 0, seed: int = 0, max_turns: int = 6, max_tokens_per_turn: int = 48,
                            max_response_tokens: int = 384, template: str = "auto", stop_at_action: bool = False,
                            env_params: dict | None = None, device: str = "cpu", dtype: str = "float32",
                            ) -> list[RewardResult]:
    """A saved verifier policy's combined score of each response as a candidate solution of its example's prompt:
    ``w_fwd P_fwd(true) + (1 - w_fwd) P_bwd(true)`` in [0, 1]; ``correct`` is the final verdict (true only if
    both agents say true). ``temperature=0`` runs greedy episodes; ``env_params`` go to the ``verify`` envs
    (e.g. ``{unsafe: true}``, sandbox limits)."""
    from credo.types import SamplingParams

    if not model_path:
        raise ValueError("agentic_verifier: reward.kwargs.model_path (a saved verifier policy directory) is required")
    model, tok = _load_verifier_model(model_path, device, dtype)
    sampling = SamplingParams(greedy=True) if temperature <= 0 else SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    verifier = AgenticVerifier(model, tok, w_fwd=w_fwd, sampling=sampling, seed=seed, max_turns=max_turns,
                               max_tokens_per_turn=max_tokens_per_turn, max_response_tokens=max_response_tokens,
                               template=template, stop_at_action=stop_at_action, env_params=env_params)
    results = verifier.score_batch([ex.prompt for ex in examples], list(responses))
    return [RewardResult(score=r.score, correct=r.correct,
                         info={k: v for k, v in r.info.items() if k not in ("forward", "backward")}
                         | {"fwd_verdict": r.info["forward"]["verdict"], "bwd_verdict": r.info["backward"]["verdict"]})
            for r in results]
