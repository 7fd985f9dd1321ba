"""Which passes an RL step runs, derived from what its pieces declare they read.

The pieces are the advantage estimator (``needs``), the policy loss (``needs``), the loss terms and the batch
transforms (``reads``), the critic loss (``needs``), and the collector (``needs.old_logprob_pass``, asked every step). From the union of
what they read the trainer decides::

    reference pass   something reads ref_logprobs or ref_entropy (a KL term, KL in the reward, VRPO's critic)
    critic pass      critic.enabled, or (null) the estimator reads values or value_quantiles
    old-log-prob     kept unless it may be fused into the update (:meth:`StepPlan.fused`)
    pass stats       the token statistics the estimator reads from that pass (entropy_direction, sum_pi_squared)

No rule here names a method: a new estimator, term or transform that reads ``old_logprobs`` keeps the pass by
declaring it.
"""
from __future__ import annotations

from dataclasses import dataclass

# what the old-log-prob pass provides (a reader of any of them keeps the pass) and the token statistics it computes
# on request
PASS_OUTPUTS = frozenset({"old_logprobs", "entropy", "entropy_direction", "entropy_history", "sum_pi_squared"})
PASS_STATS = ("entropy_direction", "sum_pi_squared")
REFERENCE_OUTPUTS = frozenset({"ref_logprobs", "ref_entropy"})
CRITIC_OUTPUTS = frozenset({"values", "value_quantiles"})


@dataclass(frozen=True)
class StepPlan:
    """The passes of a run's RL steps (built once: :func:`step_plan`)."""

    estimator_inputs: tuple[str, ...]  # the optional inputs the estimator declares (its ``needs``)
    reads: frozenset[str]  # everything the estimator, the terms, the transforms and the critic loss read
    reference: bool  # run the frozen reference's pass (ref_logprobs, and ref_entropy when read)
    critic: bool  # train a critic and run its values pass
    pass_required: bool  # the old-log-prob pass may never be fused into the update
    fusable_multi_step: bool  # the policy loss's old log-probs are the sampler's (verl's bypass mode)

    @property
    def pass_stats(self) -> tuple[str, ...]:
        """The old-log-prob pass's statistics besides entropy: those the estimator reads."""
        return tuple(n for n in PASS_STATS if n in self.estimator_inputs)

    @property
    def ref_entropy(self) -> bool:
        return "ref_entropy" in self.reads

    def fused(self, *, batch_size: int, ppo_epochs: int, mini_batch_size: int | None, mode: str,
              collector_needs_pass: bool) -> bool:
        """Whether this step skips the separate old-log-prob pass (its log-probs are the update's own, detached):
        ``train.old_logprob_pass=auto``, nothing requires the pass (``collector_needs_pass``: the collector's
        ``needs`` this step, e.g. replayed rows once a pool exists), and either one optimizer step on the whole
        batch (the policy has not moved when the loss is computed) or a loss whose old log-probs are the
        sampler's."""
        one_step = ppo_epochs == 1 and (mini_batch_size or batch_size) >= batch_size
        return mode == "auto" and not self.pass_required and not collector_needs_pass \
            and (one_step or self.fusable_multi_step)


def step_plan(*, estimator_inputs: tuple[str, ...], loss_reads: tuple[str, ...], term_reads: tuple[str, ...],
              transform_reads: tuple[str, ...], critic_reads: tuple[str, ...], critic: bool,
              one_step_off: bool, bypass_loss: bool) -> StepPlan:
    """The plan from the declarations. ``one_step_off``: the batch was sampled by the previous policy, so its
    log-probs under the current one need the pass; ``bypass_loss``: the policy loss reads the sampler's log-probs."""
    own = {"entropy"}  # a policy loss's entropy is its own forward's (with gradient), not the pass's
    reads = frozenset(estimator_inputs) | (frozenset(loss_reads) - own) | frozenset(term_reads) | \
        frozenset(transform_reads) | frozenset(critic_reads if critic else ())
    reference = bool(reads & REFERENCE_OUTPUTS)
    # the reference pass reports actor/kl against the old log-probs; a critic's warm-up steps skip the policy update
    # (no fused pass to take the log-probs from)
    required = bool(reads & PASS_OUTPUTS) or reference or critic or one_step_off
    return StepPlan(tuple(estimator_inputs), reads, reference, critic, required, bypass_loss)
