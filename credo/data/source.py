"""The examples a run trains and evaluates on, from a built-in task or a user file (``TaskConfig``)."""
from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import Callable

from credo.data.files import BadRow, BadRowsWarning, load_dataset_file, split_examples
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


def format_prompts(data: TaskData, tokenizer, *, template: str = "{prompt}", chat: bool = False) -> TaskData:
    """Rewrite every prompt as ``template.format(prompt=...)`` and, with ``chat``, as a user message wrapped in
    the tokenizer's chat template with the assistant turn opened (instruct models). Answers are untouched."""
    if template == "{prompt}" and not chat:
        return data
    if chat and not getattr(tokenizer, "chat_template", None):
        raise ValueError("task.chat_template=true but the tokenizer has no chat template (credo's tiny models "
                         "have none: use it with a pretrained instruct model)")

    def fmt(ex: Example) -> Example:
        text = template.format(prompt=ex.prompt)
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        return dataclasses.replace(ex, prompt=text)

    return dataclasses.replace(data, train=[fmt(e) for e in data.train], eval=[fmt(e) for e in data.eval],
                               stage_train=[[fmt(e) for e in st] for st in data.stage_train])


def load_task_data(cfg, *, seed: int) -> TaskData:
    """``cfg`` is a :class:`credo.config.TaskConfig`; ``seed`` is used when ``cfg.seed`` is null."""
    data_seed = cfg.seed if cfg.seed is not None else seed
    if cfg.name != "file":
        task = get_task(cfg.name, **cfg.params)
        train, eval_ = build_splits(task, train_size=cfg.train_size, eval_size=cfg.eval_size, seed=data_seed)
        return TaskData(cfg.name, train, eval_, task.default_reward, task.demonstration)
    train, bad = _read(cfg, cfg.train_file)
    if cfg.eval_file:
        eval_, bad_eval = _read(cfg, cfg.eval_file)
        bad = bad + bad_eval
    else:
        train, eval_ = split_examples(train, cfg.eval_fraction, data_seed)
    return TaskData(f"file:{cfg.train_file}", train, eval_, "exact_match", lambda ex: ex.answer, bad)


def _read(cfg, path: str) -> tuple[list[Example], list[BadRow]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BadRowsWarning)
        ds = load_dataset_file(path, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field,
                               on_bad_row=cfg.on_bad_row, max_bad_rows=cfg.max_bad_rows)
    for w in caught:
        log.warning("%s", w.message)
    return ds.examples, ds.bad_rows
