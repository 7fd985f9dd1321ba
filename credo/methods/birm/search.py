"""Using a trained BiRM: best-of-N reranking and step-level beam search (docs/reward_models.md, BiRM).

Best-of-N samples ``n`` responses per prompt and picks one per selector: the BiRM score, the value head alone
(V at the last step, an ORM-like reading of the model), the reward head alone (mean R, PRM-like), the sampled
log-probability (sum, and mean per token), against avg@n (a random pick) and pass@n (an oracle pick).

Beam search grows ``beam_width`` partial responses ``step_tokens`` tokens at a time: each live beam is extended by
``expand`` sampled steps, every candidate is scored by the BiRM (its last chunk is its last step), and the best
``beam_width`` of the finished and live candidates survive; it ends when all survivors are finished (EOS or the
token budget) and returns the best-scored finished response.
"""
from __future__ import annotations

import dataclasses

import torch

from credo.methods.birm.train import score_responses
from credo.types import Example, SamplingParams

SELECTORS = ("birm", "value", "reward", "logprob_sum", "logprob_mean")


def best_of_n(engine, runner, model, tokenizer, examples: list[Example], *, n: int, sampling: SamplingParams,
              step_tokens: int, beta: float = 1.0, agg: str = "mean") -> dict[str, float]:
    """Accuracy of the response each selector picks out of ``n`` samples per example, plus avg@n and pass@n."""
    trajs = engine.generate(examples, n, sampling)
    correct = torch.tensor([float(r.correct) for r in runner.score([t.response_text for t in trajs],
                                                                    [t.example for t in trajs])]).view(-1, n)
    s = score_responses(model, tokenizer, [t.prompt_ids for t in trajs], [t.response_ids for t in trajs],
                        step_tokens=step_tokens, beta=beta, agg=agg)
    lp = [torch.tensor(t.rollout_logprobs or [0.0]) for t in trajs]
    keys = {"birm": s["score"], "value": s["value"], "reward": s["reward"],
            "logprob_sum": torch.stack([x.sum() for x in lp]), "logprob_mean": torch.stack([x.mean() for x in lp])}
    out = {f"bon/{name}": float(correct.gather(1, key.view(-1, n).argmax(-1, keepdim=True)).mean())
           for name, key in keys.items()}
    return out | {"bon/avg": float(correct.mean()), "bon/pass": float(correct.max(-1).values.mean())}


def beam_search(engine, model, tokenizer, examples: list[Example], *, beam_width: int, expand: int,
                step_tokens: int, sampling: SamplingParams, beta: float = 1.0, agg: str = "mean") -> list[list[int]]:
    """The best-scored finished response (token ids) per example."""
    prompts = [engine.encode(ex.prompt) for ex in examples]
    budget = sampling.max_new_tokens
    step_sp = dataclasses.replace(sampling, max_new_tokens=step_tokens)
    # per example: list of (response ids, finished, score)
    beams: list[list[tuple[list[int], bool, float]]] = [[([], False, 0.0)] for _ in examples]
    while any(not done for b in beams for _, done, _ in b):
        rows = [(e, ids) for e, b in enumerate(beams) for ids, done, _ in b if not done for _ in range(expand)]
        conts = engine.continue_ids([prompts[e] + ids for e, ids in rows], step_sp)
        cands: list[list[tuple[list[int], bool]]] = [[(ids, True) for ids, done, _ in b if done] for b in beams]
        for (e, ids), c in zip(rows, conts):
            new = ids + c.ids
            finished = c.finish_reason == "stop" or len(new) >= budget
            if (new, finished) not in cands[e]:
                cands[e].append((new[:budget], finished))
        flat = [(e, ids, fin) for e, cs in enumerate(cands) for ids, fin in cs]
        scores = score_responses(model, tokenizer, [prompts[e] for e, _, _ in flat], [ids for _, ids, _ in flat],
                                 step_tokens=step_tokens, beta=beta, agg=agg)["score"].tolist()
        beams = [[] for _ in examples]
        for (e, ids, fin), sc in sorted(zip(flat, scores), key=lambda x: -x[1]):
            if len(beams[e]) < beam_width:
                beams[e].append((ids, fin, sc))
    return [max(b, key=lambda x: x[2])[0] for b in beams]
