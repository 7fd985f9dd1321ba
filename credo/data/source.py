"""The examples a run trains and evaluates on, from a built-in task, a user file or a hub dataset (``TaskConfig``;
credo.data.files, credo.data.hub)."""
from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import Callable

from credo.data.files import BadRow, BadRowsWarning, DatasetError, bad_row_summary, load_dataset_file, split_examples
from credo.data.tasks import build_splits, get_task
from credo.types import Example

log = logging.getLogger(__name__)


@dataclass
class TaskData:
    name: str
    train: list[Example]
    eval: list[Example]
    default_reward: str | None  # verifier name; None when rewards come from environments (agent RL)
    demonstration: Callable[[Example], str] | None  # a correct response, for the SFT warm start
    bad_rows: list[BadRow] = field(default_factory=list)
    # (tokenizer, examples) -> TrainBatch of demonstrations; None = single-turn demonstrations above
    sft_batch: Callable | None = None
    stage_train: list[list[Example]] = field(default_factory=list)  # per sequential stage (agent RL)
    origins: dict[str, tuple[str, int]] = field(default_factory=dict)  # file rows: uid -> (path, line)
    source: dict = field(default_factory=dict)  # task.name=hf: {dataset, commit, subset, split, eval_split, streamed}


def format_prompts(data: TaskData, tokenizer, *, template: str = "{prompt}", chat: bool = False) -> TaskData:
    """Rewrite every prompt as ``template.format(prompt=...)`` and, with ``chat``, as a user message wrapped in
    the tokenizer's chat template with the assistant turn opened (instruct models). A prompt that came as chat
    messages (``meta["prompt_messages"]``, :mod:`credo.data.files`) is rendered with the tokenizer's chat
    template when it has one and stays credo's plain rendering otherwise; ``template`` does not apply to it.
    Answers are untouched."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if template == "{prompt}" and not chat and not (has_template and _any_messages(data)):
        return data
    if chat and not has_template:
        raise ValueError("task.chat_template=true but the tokenizer has no chat template (credo's tiny models "
                         "have none: use it with a pretrained instruct model)")

    def fmt(ex: Example) -> Example:
        if "prompt_messages" in ex.meta:
            if not has_template:
                return ex
            return dataclasses.replace(ex, prompt=tokenizer.apply_chat_template(
                ex.meta["prompt_messages"], tokenize=False, add_generation_prompt=True))
        text = template.format(prompt=ex.prompt)
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        return dataclasses.replace(ex, prompt=text)

    return dataclasses.replace(data, train=[fmt(e) for e in data.train], eval=[fmt(e) for e in data.eval],
                               stage_train=[[fmt(e) for e in st] for st in data.stage_train])


def _any_messages(data: TaskData) -> bool:
    return any("prompt_messages" in ex.meta for ex in (*data.train, *data.eval))


def load_task_data(cfg, *, seed: int) -> TaskData:
    """``cfg`` is a :class:`credo.config.TaskConfig`; ``seed`` is used when ``cfg.seed`` is null."""
    data_seed = cfg.seed if cfg.seed is not None else seed
    if cfg.name == "hf":
        return _load_hub(cfg, data_seed)
    if cfg.name != "file":
        task = get_task(cfg.name, curriculum=cfg.curriculum, **cfg.params)
        train, eval_ = build_splits(task, train_size=cfg.train_size, eval_size=cfg.eval_size, seed=data_seed)
        return TaskData(cfg.name, train, eval_, task.default_reward, task.demonstration)
    origins: dict[str, tuple[str, int]] = {}
    train, bad = _read(cfg, cfg.train_file, origins)
    if cfg.eval_file:
        eval_, bad_eval = _read(cfg, cfg.eval_file, origins)
        bad = bad + bad_eval
    else:
        train, eval_ = split_examples(train, cfg.eval_fraction, data_seed)
    return TaskData(f"file:{cfg.train_file}", train, eval_, "exact_match", lambda ex: ex.answer, bad,
                    origins=origins)


def _load_hub(cfg, data_seed: int) -> TaskData:
    """``task.name=hf``: the split (and eval split, else a held-out ``eval_fraction``) of a hub dataset
    (credo.data.hub); the rows' origins are ``(org/name[split], row)``."""
    from credo.data.hub import load_hub_split

    origins: dict[str, tuple[str, int]] = {}
    train, source = _collect(lambda: load_hub_split(cfg, cfg.split, stream_rows=cfg.train_size), origins)
    bad = list(train.bad_rows)
    if cfg.eval_split:
        evals, _ = _collect(lambda: load_hub_split(cfg, cfg.eval_split, stream_rows=cfg.eval_size), origins)
        train_ex, eval_ex = train.examples, evals.examples
        bad += evals.bad_rows
    else:
        train_ex, eval_ex = split_examples(train.examples, cfg.eval_fraction, data_seed)
    info = {"dataset": source.dataset, "commit": source.commit, "subset": source.subset, "split": source.split,
            "eval_split": cfg.eval_split, "streamed": source.streamed}
    return TaskData(f"hf:{cfg.dataset}", train_ex, eval_ex, "exact_match", lambda ex: ex.answer, bad,
                    origins=origins, source=info)


def _collect(load: Callable, origins: dict[str, tuple[str, int]]):
    """``load()`` -> (FileDataset, extra) with its bad-row warning logged and its rows' origins recorded."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BadRowsWarning)
        ds, extra = load()
    for w in caught:
        log.warning("%s", w.message)
    origins.update((ex.uid, (ds.path, line)) for ex, line in zip(ds.examples, ds.lines))
    return ds, extra


def _read(cfg, path: str, origins: dict[str, tuple[str, int]]) -> tuple[list[Example], list[BadRow]]:
    """The file's examples and bad rows; records each example's (path, line) in ``origins``."""
    ds, _ = _collect(lambda: (load_dataset_file(path, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field,
                                                on_bad_row=cfg.on_bad_row, max_bad_rows=cfg.max_bad_rows,
                                                max_row_bytes=cfg.max_row_bytes,
                                                answer_transform=cfg.answer_transform), None), origins)
    return ds.examples, ds.bad_rows


# ---------------------------------------------------------------------------------------- context length

_TOKENIZE_BATCH = 256


def model_context(model) -> int | None:
    """The context length of a Hugging Face model (``config.max_position_embeddings``, or GPT-2's
    ``n_positions``); None when its config states none."""
    config = getattr(model, "config", None)
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def prompt_token_counts(tokenizer, prompts: list[str]) -> list[int]:
    """Prompt lengths in tokens as the rollout engine encodes them (with the tokenizer's special tokens)."""
    counts: list[int] = []
    for i in range(0, len(prompts), _TOKENIZE_BATCH):
        ids = tokenizer(prompts[i : i + _TOKENIZE_BATCH], add_special_tokens=True)["input_ids"]
        counts += [len(x) for x in ids]
    return counts


def _overlong(data: TaskData, split: str, examples: list[Example], tokenizer, cfg, *, context: int,
              max_new_tokens: int) -> tuple[list[Example], list[BadRow]]:
    """``(kept, bad rows)`` of one split; a too-long prompt of a generated task, or of a file row under
    ``on_bad_row=error``, raises :class:`DatasetError`."""
    kept, bad = [], []
    for ex, n in zip(examples, prompt_token_counts(tokenizer, [ex.prompt for ex in examples])):
        if n + max_new_tokens <= context:
            kept.append(ex)
            continue
        why = (f"prompt is {n} tokens + rollout.max_new_tokens={max_new_tokens} = {n + max_new_tokens}, over the "
               f"model's max_position_embeddings={context}")
        if cfg.name not in ("file", "hf"):
            raise DatasetError(f"task {cfg.name!r} with params {dict(cfg.params)}: {split} example {ex.uid}: {why}; "
                               "choose smaller task parameters, a shorter prompt_template or fewer max_new_tokens")
        path, line = data.origins.get(ex.uid, (data.name, 0))
        row = BadRow(path, line, why)
        if cfg.on_bad_row == "error":
            raise DatasetError(str(row))
        bad.append(row)
    return kept, bad


def drop_overlong(data: TaskData, tokenizer, cfg, *, context: int | None, max_new_tokens: int) -> TaskData:
    """Check every (formatted) prompt against the model's context: ``prompt tokens + max_new_tokens`` must fit in
    ``context`` (:func:`model_context`; None = not checked). ``cfg`` is the :class:`credo.config.TaskConfig`.

    A file row that does not fit is a bad row: skipped, counted in ``data.bad_rows`` and summarised in one warning
    (``on_bad_row=skip``), or fatal (``on_bad_row=error``, more than ``max_bad_rows`` bad rows in all, or no
    training row left). A generated task's prompt that does not fit is always fatal (:class:`DatasetError`).
    """
    if context is None:
        return data
    if max_new_tokens >= context:
        raise DatasetError(f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                           f"max_position_embeddings={context}")
    kw = dict(context=context, max_new_tokens=max_new_tokens)
    train, bad = _overlong(data, "train", data.train, tokenizer, cfg, **kw)
    eval_, bad_eval = _overlong(data, "eval", data.eval, tokenizer, cfg, **kw)
    bad += bad_eval
    if not bad:
        return data
    summary = bad_row_summary(bad)
    total = len(data.bad_rows) + len(bad)
    if cfg.max_bad_rows is not None and total > cfg.max_bad_rows:
        raise DatasetError(f"{data.name}: more than max_bad_rows={cfg.max_bad_rows} bad rows ({total}); {summary}")
    if not train:
        raise DatasetError(f"{data.name}: no training prompt fits the model's context ({len(bad)} too long: "
                           f"{summary})")
    log.warning("%s: skipped %d rows longer than the model's context: %s", data.name, len(bad), summary)
    return dataclasses.replace(data, train=train, eval=eval_, bad_rows=data.bad_rows + bad)
