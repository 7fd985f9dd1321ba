"""Models: tiny models from a config, the character tokenizer, local from_pretrained round trips."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from credo.config import ModelConfig
from credo.models import build_char_tokenizer, build_model, encode_prompt, encode_response, load_model, save_model
from tests.conftest import TINY


def test_char_tokenizer_round_trip_and_specials():
    tok = build_char_tokenizer()
    text = "rev abc=\n(3+5)*2 to 16:"
    ids = encode_prompt(tok, text)
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1  # one token per character plus BOS
    assert tok.decode(ids, skip_special_tokens=True) == text
    resp = encode_response(tok, "cba")
    assert resp[-1] == tok.eos_token_id and len(resp) == 4
    assert tok.pad_token_id not in ids and len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3


def test_default_demo_model_is_half_a_million_parameters():
    model, _ = build_model(ModelConfig(), seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert 400_000 < n < 600_000
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 2


def test_build_is_seeded_and_does_not_touch_global_rng():
    state = torch.get_rng_state()
    a, _ = build_model(TINY, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    b, _ = build_model(TINY, seed=3)
    c, _ = build_model(TINY, seed=4)
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_save_and_from_pretrained_round_trip(tmp_path: Path, arch: str):
    cfg = ModelConfig(**{**TINY.__dict__, "arch": arch})
    model, tok = build_model(cfg, seed=0)
    save_model(model, tok, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file() and (tmp_path / "m" / "config.json").is_file()
    loaded, tok2 = load_model(tmp_path / "m")
    assert loaded.config.model_type == arch
    ids = torch.tensor([encode_prompt(tok, "rev abc=")])
    assert encode_prompt(tok2, "rev abc=") == ids[0].tolist()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, loaded(ids).logits)


def test_load_model_from_a_foreign_hf_directory(tmp_path: Path):
    """A directory written by plain transformers (no credo involvement) loads too."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=101, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "foreign")
    build_char_tokenizer().save_pretrained(tmp_path / "foreign")
    model, tok = load_model(tmp_path / "foreign")
    assert model.config.hidden_size == 16 and tok.eos_token_id is not None


def test_load_model_errors_clearly_on_a_non_model_directory(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model directory"):
        load_model(tmp_path)
