"""Name -> function registries for policy losses and advantage estimators.

One signature per kind; the math takes tensors and keyword hyperparameters, never a config object.

Policy loss (per token, before aggregation)::

    @register_policy_loss("name", zero_adv_inert=True)  # True: rows with A == 0 have no gradient (see Registered)
    def my_loss(*, logprobs, old_logprobs, advantages, response_mask, entropy=None, ref_logprobs=None,
                my_hparam: float = 0.1) -> TokenLoss

A loss that also names ``token_weights`` (B, T) in its signature receives the detached rollout-correction
weights and applies them itself (a sequence-level loss reduces them per sequence, e.g. GMPO's geometric mean);
any other loss has its per-token loss multiplied by them. ``uses_rollout_logprobs=True`` declares a loss whose
``old_logprobs`` are the sampler's log-probs (verl's bypass mode: no recomputed old log-probs) and which computes
its own importance weights, so the update applies none.

Advantage estimator::

    @register_advantage("name", needs=("values",), groups=False)  # needs: optional inputs; groups: a group baseline
    def my_adv(*, rewards, group_ids, response_mask, values=None, my_hparam: float = 1.0) -> AdvantageOutput

Every keyword after the fixed tensor arguments is a hyperparameter; its default is the released
recipe value, and :func:`check_hparams` validates config-supplied names and types against it.

Each table is a :class:`credo.registry.Registry` of :class:`Registered` entries: ``TABLE.get(name)`` raises
``unknown <kind> 'name' (did you mean ...)``, ``TABLE.names()`` lists every built-in. ``credo.algo`` imports its own
built-ins eagerly; a method package outside it (``credo.methods.*``) that registers an entry is named in the table's
``builtins`` and imported on the first lookup or listing.
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from credo.registry import Registry, _same

LOSS_TENSOR_ARGS = ("logprobs", "old_logprobs", "advantages", "response_mask", "entropy", "ref_logprobs",
                    "token_weights")
ADV_TENSOR_ARGS = ("rewards", "group_ids", "response_mask", "values", "reward_baselines", "entropy_direction",
                   "entropy_history", "value_quantiles", "tree_paths", "old_logprobs", "sum_pi_squared",
                   "rollout_is_weights", "reward_components")


@dataclass
class TokenLoss:
    """Output of a registered policy loss, before aggregation."""

    loss: torch.Tensor  # (B, T) per-token loss L_it
    token_metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # (B, T) values, masked-mean'ed
    metrics: dict[str, float] = field(default_factory=dict)  # already-reduced scalars
    # A scalar term added after aggregation, already a mean over its own token set within this call
    # (e.g. Archer's KL over low-entropy tokens). compute_policy_loss scales it by this call's share of
    # the mini-batch, so micro-batch losses still sum to a mini-batch loss (exactly so for one micro-batch).
    aux_loss: torch.Tensor | None = None


@dataclass(frozen=True)
class Registered:
    name: str
    fn: Callable[..., Any]
    hparams: dict[str, Any]  # hyperparameter name -> default
    forced_agg: str | None = None  # aggregation the method prescribes regardless of config
    needs: tuple[str, ...] | Callable[[dict[str, Any]], tuple[str, ...]] = ()  # optional inputs it requires
    doc: str = ""
    inputs: tuple[str, ...] = ()  # the fixed tensor arguments the function accepts
    # True (or hparams -> bool): a row whose advantages are all zero gets zero loss and zero gradient, and no
    # other row's loss depends on it, so the trainer may leave such rows out of the forward / backward
    zero_adv_inert: bool | Callable[[dict[str, Any]], bool] = False
    groups: bool = False  # an estimator whose baseline is the other samples of the prompt's group (needs G >= 2)
    # a policy loss whose old_logprobs input is the sampler's rollout_logprobs and that computes its own importance
    # weights (verl's bypass mode): the update passes rollout_logprobs and no rollout-correction token_weights
    uses_rollout_logprobs: bool = False

    def requirements(self, hparams: dict[str, Any] | None = None) -> tuple[str, ...]:
        """Optional inputs needed with these hyperparameters (defaults filled in)."""
        if callable(self.needs):
            return tuple(self.needs({**self.hparams, **(hparams or {})}))
        return tuple(self.needs)

    def inert_at_zero_advantage(self, hparams: dict[str, Any] | None = None) -> bool:
        """Whether rows with all-zero advantages can be dropped without changing the loss or any gradient."""
        if callable(self.zero_adv_inert):
            return bool(self.zero_adv_inert({**self.hparams, **(hparams or {})}))
        return bool(self.zero_adv_inert)


def _same_fn(a: Registered | Callable[..., Any], b: Registered | Callable[..., Any]) -> bool:
    """The same registered function (its module imported twice counts as the same); either side may be the bare
    function (a decorator checks the name before it builds the entry)."""
    return _same(getattr(a, "fn", a), getattr(b, "fn", b))


POLICY_LOSSES: Registry[Registered] = Registry("policy loss", builtins=("credo.algo.losses",), same=_same_fn)
ADVANTAGE_ESTIMATORS: Registry[Registered] = Registry("advantage estimator", builtins=(
    "credo.algo.advantages", "credo.methods.attnrl.advantage", "credo.methods.dvpo.advantage",
    "credo.methods.dfpo.advantage"), same=_same_fn)


def _hparams_of(fn: Callable[..., Any], tensor_args: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in tensor_args:
            continue
        if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
            raise TypeError(f"{fn.__name__}: hyperparameter {p.name!r} must be keyword-only with a default")
        out[p.name] = p.default
    return out


def _register(table: Registry[Registered], tensor_args: tuple[str, ...]):
    def register(name: str, *, forced_agg: str | None = None,
                 needs: tuple[str, ...] | Callable[[dict[str, Any]], tuple[str, ...]] = (),
                 zero_adv_inert: bool | Callable[[dict[str, Any]], bool] = False, groups: bool = False,
                 uses_rollout_logprobs: bool = False):
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            table.refuse_taken(name, fn)
            doc = (inspect.getdoc(fn) or "").split("\n")[0]
            accepted = tuple(p for p in inspect.signature(fn).parameters if p in tensor_args)
            table.add(name, Registered(name, fn, _hparams_of(fn, tensor_args), forced_agg,
                                       needs if callable(needs) else tuple(needs), doc, accepted, zero_adv_inert,
                                       groups, uses_rollout_logprobs))
            return fn

        return deco

    return register


register_policy_loss = _register(POLICY_LOSSES, LOSS_TENSOR_ARGS)
register_advantage = _register(ADVANTAGE_ESTIMATORS, ADV_TENSOR_ARGS)


def check_hparams(table: Registry[Registered], name: str, hparams: dict[str, Any]) -> None:
    """Raise TypeError naming the first unknown or wrongly typed hyperparameter (UnknownName for an unknown
    ``name``)."""
    entry, kind = table.get(name), table.kind
    for key, value in hparams.items():
        if key not in entry.hparams:
            close = difflib.get_close_matches(key, list(entry.hparams), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(entry.hparams) or "none"
            raise TypeError(f"{kind} {name!r} has no hyperparameter {key!r}{hint}; it takes: {known}")
        default = entry.hparams[key]
        if not _type_ok(value, default):
            raise TypeError(
                f"{kind} {name!r}: hyperparameter {key!r} expects {type(default).__name__}, got {value!r}"
            )


def _type_ok(value: Any, default: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, type(default))
