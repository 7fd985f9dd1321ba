"""Which stage reads which key: the declarations behind "no silent no-ops" (docs/guarantees.md).

A config key that only one stage of the run reads says so beside its field, by the *reader* it needs::

    url: str | None = opt(None, "...", read_if="vllm_server")      # a key
    vllm: VLLMConfig = opt(None, "...", read_if="vllm_engine")     # a section: every key inside it

and the reader is registered once with the predicate that says whether a run, in its configuration, runs it::

    READERS.add("vllm_server", Reader(lambda cfg: cfg.rollout.engine == "vllm" and cfg.rollout.vllm.mode ==
                                      "server", "rollout.engine=vllm with rollout.vllm.mode=server"))

``read_if`` may name several readers (a tuple): all must run. A key without ``read_if`` is read by every run. A
reader declared ``harmless`` (a key whose being unread changes nothing a user expects, documented so on its field,
e.g. a CUDA-only knob on the CPU) makes an unread key a warning instead of a refusal.

:func:`unread_keys` lists every key of a config that the run will not read (``credo config show`` marks them);
:func:`check_reads` refuses (:class:`ConfigError`) a key given by a preset or an override that the run will not
read. Choice sections need no declaration: a key of another choice's class is already an unknown key
(:func:`credo.config.loader.build_choice`), and an optional section (``replay``, ``distill``, ``model.lora``) is
on exactly when it is given.

Readers of the core schema are below; a method package registers its own beside its config dataclass (its
module is one of :data:`credo.config.validate.BUILTIN_VALIDATORS`, imported before the first lookup).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from credo.config.validate import BUILTIN_VALIDATORS
from credo.errors import ConfigError
from credo.registry import Registry
from credo.tracking.trackers import flatten

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Reader:
    """A stage that reads some keys: ``when(cfg)`` is true when the run runs it; ``says`` names that condition
    for a message (``rollout.engine=vllm``); ``harmless``: an unread key of it is a warning, not a refusal."""
    when: Callable[[Any], bool]
    says: str
    harmless: bool = False


# the method packages that declare readers beside their configs are the validators' modules
READERS: Registry[Reader] = Registry("config reader", builtins=BUILTIN_VALIDATORS)


@dataclasses.dataclass(frozen=True)
class Unread:
    """A key the run will not read: the readers it needs that do not run."""
    key: str
    readers: tuple[str, ...]

    def says(self) -> str:
        return " and ".join(READERS.get(r).says for r in self.readers)

    @property
    def harmless(self) -> bool:
        return all(READERS.get(r).harmless for r in self.readers)


# ----------------------------------------------------------------------------- the walk


def _read_if(f: dataclasses.Field) -> tuple[str, ...]:
    r = f.metadata.get("read_if")
    return () if r is None else (r,) if isinstance(r, str) else tuple(r)


def leaf_keys(cfg: Any, prefix: str = "") -> dict[str, tuple[Any, dataclasses.Field, tuple[str, ...]]]:
    """Every key of ``cfg`` (a config dataclass) as ``dotted key -> (value, field, readers)``; ``readers`` are the
    ``read_if`` of the field and of every section around it. An optional section that is off (null) is one key."""
    out: dict[str, tuple[Any, dataclasses.Field, tuple[str, ...]]] = {}
    _walk(cfg, prefix, (), out)
    return out


def _walk(obj: Any, prefix: str, outer: tuple[str, ...], out: dict) -> None:
    for f in dataclasses.fields(obj):
        value, key, readers = getattr(obj, f.name), prefix + f.name, outer + _read_if(f)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _walk(value, key + ".", readers, out)
        else:
            out[key] = (value, f, readers)


def unread_keys(cfg: Any) -> dict[str, Unread]:
    """The keys of ``cfg`` the run will not read (a reader of theirs does not run), by dotted key."""
    out = {}
    for key, (_, _, readers) in leaf_keys(cfg).items():
        off = tuple(r for r in readers if not READERS.get(r).when(cfg))
        if off:
            out[key] = Unread(key, off)
    return out


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def verdicts(cfg: Any, sources: dict[str, str], *, resumed: bool = False) -> dict[str, tuple[str, Unread]]:
    """The keys of ``cfg`` the run will not read that a preset or an override gives, as ``key -> (verdict,
    unread)`` with verdict ``refuse`` or ``warn`` (one sentence why in :func:`warning`):

    - an override: refused (the user typed it), even at its default value;
    - a preset's key at its default value: not given (a full ``config.yaml`` repeats every default);
    - a preset's key the preset on its own reads but the overrides switched off (``Sources.turned_off``:
      ``dynamic_sampling=false`` over a preset's ``max_gen_batches``, a resume's ``distributed.backend=none``), and
      with ``resumed`` any key of the run directory's own config (accepted when the run started, perhaps by an
      older credo that declared fewer readers): a warning; any other preset key: refused;
    - a harmless reader's key: a warning."""
    keys, out = leaf_keys(cfg), {}
    turned_off = getattr(sources, "turned_off", frozenset())
    for key, unread in unread_keys(cfg).items():
        source = sources.get(key, "default")
        value, f, _ = keys[key]
        if source == "default" or (source == "preset" and value == default_of(f)):
            continue
        soft = unread.harmless or (source == "preset" and (resumed or key in turned_off))
        out[key] = ("warn" if soft else "refuse", unread)
    return out


def check_reads(cfg: Any, sources: dict[str, str], *, resumed: bool = False) -> list[Unread]:
    """Refuse (:class:`ConfigError`) the first key :func:`verdicts` refuses; log the warnings and return them."""
    warned = []
    for key, (verdict, unread) in verdicts(cfg, sources, resumed=resumed).items():
        if verdict == "refuse":
            given = "override" if sources.get(key) == "override" else "preset"
            raise ConfigError(f"{key}: the run would not read this key ({given} {leaf_keys(cfg)[key][0]!r}): it is "
                              f"read only with {unread.says()}; remove it or change the setting it depends on")
        log.warning("%s: not read by this run (only with %s); ignored", key, unread.says())
        warned.append(unread)
    return warned


# ----------------------------------------------------------------------------- where each key came from


def flat_paths(data: dict[str, Any]) -> set[str]:
    """The dotted paths of a nested mapping's leaves (:func:`credo.tracking.trackers.flatten`'s keys)."""
    return set(flatten(data))


def source_of(key: str, given: set[str]) -> bool:
    """Whether ``key`` (a config leaf) is given by a source whose leaf paths are ``given``: the key itself, a
    path inside it (a mapping-valued key) or a section around it given whole."""
    if key in given:
        return True
    return any(p.startswith(key + ".") or key.startswith(p + ".") for p in given)


class Sources(dict):
    """``dotted key -> "override" | "preset" | "default"``; ``turned_off``: the preset's keys its own
    configuration reads but the overrides' does not (an override switched their stage off)."""
    turned_off: frozenset = frozenset()


def key_sources(cfg: Any, preset: set[str], overrides: set[str], *, preset_cfg: Any = None) -> Sources:
    """Each key's source in ``cfg`` (:class:`Sources`); ``preset_cfg``: the preset built alone (None: unknown,
    every preset key the run does not read counts as turned off by the overrides)."""
    out = Sources()
    for key in leaf_keys(cfg):
        out[key] = "override" if source_of(key, overrides) else "preset" if source_of(key, preset) else "default"
    alone = set(unread_keys(preset_cfg)) if preset_cfg is not None else set()
    out.turned_off = frozenset(k for k in unread_keys(cfg) if out[k] == "preset" and k not in alone)
    return out


# ----------------------------------------------------------------------------- the core schema's readers


def _critic_on(cfg: Any) -> bool:
    from credo.algo import ADVANTAGE_ESTIMATORS

    if cfg.critic.enabled is not None:
        return bool(cfg.critic.enabled)
    needs = ADVANTAGE_ESTIMATORS[cfg.algo.advantage].requirements(cfg.algo.advantage_args)
    return bool({"values", "value_quantiles"} & set(needs))


def warm_start_on(cfg: Any) -> bool:
    """Whether the run warm-starts (``warm_start.enabled``, or null: a freshly built model)."""
    w = cfg.warm_start.enabled
    return (cfg.model.path is None) if w is None else bool(w)


def _correction_on(cfg: Any) -> bool:
    rc = cfg.algo.rollout_correction
    return rc != "none" and not (rc == "auto" and cfg.rollout.engine != "vllm")


def _cuda(cfg: Any) -> bool:
    return str(cfg.model.device).startswith("cuda")


_CORE = {
    "fresh_model": Reader(lambda c: c.model.path is None, "model.path=null (a freshly built model)"),
    "pretrained_model": Reader(lambda c: c.model.path is not None or getattr(getattr(c, "critic", None), "path", None)
                               is not None,
                               "a model.path or critic.path"),
    "llava": Reader(lambda c: c.model.path is None and c.model.arch == "llava", "model.arch=llava (built)"),
    "file_or_hf_task": Reader(lambda c: c.task.name in ("file", "hf"), "task.name=file or hf"),
    "rg_task": Reader(lambda c: str(c.task.name).startswith("rg:"), "a task.name=rg:<dataset>"),
    "vllm_engine": Reader(lambda c: c.rollout.engine == "vllm", "rollout.engine=vllm"),
    "vllm_server": Reader(lambda c: c.rollout.vllm.mode == "server", "rollout.vllm.mode=server"),
    "vllm_torchdist": Reader(lambda c: c.rollout.vllm.weight_sync in ("auto", "torchdist"),
                             "rollout.vllm.weight_sync=torchdist (or auto)"),
    "vllm_buckets": Reader(lambda c: c.rollout.vllm.weight_sync != "safetensors",
                           "rollout.vllm.weight_sync=torchdist, nccl, ipc or auto"),
    "cuda": Reader(_cuda, "model.device=cuda (vLLM's CPU build ignores it)", harmless=True),
    "async": Reader(lambda c: c.rollout.max_staleness >= 1, "rollout.max_staleness >= 1 (or one_step_off)"),
    "partial": Reader(lambda c: c.rollout.partial, "rollout.partial=true"),
    "dynamic_sampling": Reader(lambda c: getattr(c.rollout.collector, "dynamic_sampling", False),
                               "rollout.collector.dynamic_sampling=true"),
    "overlong": Reader(lambda c: c.reward.overlong_buffer > 0, "reward.overlong_buffer > 0"),
    "reward_noise": Reader(lambda c: c.reward.noise > 0, "reward.noise > 0"),
    "noise_flip": Reader(lambda c: c.reward.noise_mode == "flip", "reward.noise_mode=flip"),
    "noise_perturb": Reader(lambda c: c.reward.noise_mode == "perturb", "reward.noise_mode=perturb"),
    "kl": Reader(lambda c: c.algo.kl_coef > 0, "algo.kl_coef > 0"),
    "seq_norm": Reader(lambda c: c.algo.agg == "seq-mean-token-sum-norm", "algo.agg=seq-mean-token-sum-norm"),
    "rollout_correction": Reader(_correction_on, "algo.rollout_correction on (auto: with rollout.engine=vllm)"),
    "sft_term": Reader(lambda c: c.algo.sft_coef > 0, "algo.sft_coef > 0"),
    "critic": Reader(_critic_on, "a critic (critic.enabled=true, or null with an estimator that reads values)"),
    "budget": Reader(lambda c: c.train.budget != "steps", "train.budget=sampled_tokens, trained_tokens or wall_s"),
    "packing": Reader(lambda c: c.train.pack, "train.pack=true"),
    "lr_decay": Reader(lambda c: c.train.lr_schedule != "constant", "train.lr_schedule=cosine or linear"),
    "warm_start": Reader(warm_start_on, "a warm start (warm_start.enabled=true, or null with model.path=null)"),
    "wandb": Reader(lambda c: "wandb" in c.log.trackers, "log.trackers with wandb"),
    "mlflow": Reader(lambda c: "mlflow" in c.log.trackers, "log.trackers with mlflow"),
    "trackio": Reader(lambda c: "trackio" in c.log.trackers, "log.trackers with trackio"),
    "multi_rank": Reader(lambda c: c.distributed.backend != "none", "distributed.backend=torchrun or ray"),
    "torchrun": Reader(lambda c: c.distributed.backend == "torchrun", "distributed.backend=torchrun"),
    "ray": Reader(lambda c: c.distributed.backend == "ray", "distributed.backend=ray"),
    "first_ratio_guard": Reader(lambda c: c.guards.first_ratio != "off", "guards.first_ratio=error or warn"),
    "weight_sync_guard": Reader(lambda c: c.guards.weight_sync != "off", "guards.weight_sync=error or warn"),
}
for _name, _reader in _CORE.items():
    READERS.add(_name, _reader)

