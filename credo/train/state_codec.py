"""Trainer state on disk in a format that cannot run code: JSON for the structure, safetensors for the tensors.

``save_state(state, directory)`` writes ``trainer_state.json`` and ``trainer_state.safetensors``;
``load_state(directory)`` reads them back. The JSON holds plain values (``None``, bools, ints, floats, strings,
lists, string-keyed dicts) and tagged objects ``{"$type": ...}`` for the rest:

    tensor      a tensor of the safetensors file, by key (optimizer moments, RNG generator states)
    tuple       a tuple (Python ``random`` state, Adam betas)
    dict        a dict with non-string keys (optimizer ``state`` is keyed by parameter index)
    ndarray     a numeric numpy array as a list with its dtype (numpy's RNG key)
    numpy       a numpy scalar
    dataclass   one of the allow-listed dataclasses of :data:`STATE_TYPES` (the one-step-off pending rollouts)
    ref         a dataclass instance stored earlier in the file (AttnRL paths share their tree, as in memory)

Decoding builds only these types: no class is looked up by a name from the file outside the allow-list, so a
crafted file can at worst fail to load (:class:`StateFormatError`), never execute anything.

The allow-list is a registry: the core state types (:mod:`credo.types`) are registered here, and a package whose
own dataclasses go into the trainer state registers them where it defines them (:func:`register_state_type`), its
module named among :data:`STATE_TYPES`' built-ins so that a checkpoint loads before that package was imported.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from credo.registry import Registry, UnknownName
from credo.types import Example, RewardResult, Rollouts, SamplingParams, Trajectory

JSON_FILE = "trainer_state.json"
TENSOR_FILE = "trainer_state.safetensors"
FORMAT = "credo-trainer-state/1"
TAG = "$type"
# class name -> dataclass the trainer state may hold; built-ins: the modules that register their own state types
STATE_TYPES: Registry[type] = Registry("trainer-state type", builtins=("credo.methods.attnrl.algo",))
NUMPY_KINDS = "biuf"  # bool, signed, unsigned, float: the numpy dtypes an array or scalar may have


class StateFormatError(ValueError):
    """A trainer state file that is malformed or holds something outside the format."""


def register_state_type(*classes: type) -> None:
    """Allow instances of these dataclasses in the trainer state (stored by class name, so a name is one class)."""
    for cls in classes:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls!r} is not a dataclass")
        STATE_TYPES.add(cls.__name__, cls)


register_state_type(Rollouts, Trajectory, RewardResult, Example, SamplingParams)


def _state_type(name: str) -> type | None:
    """The registered dataclass of this name, or None."""
    try:
        return STATE_TYPES.get(name)
    except UnknownName:
        return None


def save_state(state: Any, directory: Path) -> None:
    """Write ``state`` as ``directory/trainer_state.json`` + ``trainer_state.safetensors``."""
    tensors: dict[str, torch.Tensor] = {}
    doc = {"format": FORMAT, "state": encode(state, tensors, {})}
    save_file(tensors, str(Path(directory) / TENSOR_FILE))
    (Path(directory) / JSON_FILE).write_text(json.dumps(doc, allow_nan=True))


def load_state(directory: Path) -> Any:
    """The state written by :func:`save_state`; :class:`StateFormatError` if the files are not of that format."""
    directory = Path(directory)
    try:
        doc = json.loads((directory / JSON_FILE).read_text())
        tensors = load_file(str(directory / TENSOR_FILE))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFormatError(f"{directory}: unreadable trainer state ({exc})") from exc
    except Exception as exc:  # safetensors raises its own SafetensorError on a damaged header or size
        raise StateFormatError(f"{directory / TENSOR_FILE}: unreadable tensors ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StateFormatError(f"{directory / JSON_FILE}: not a {FORMAT} file")
    return decode(doc.get("state"), tensors, {})


def encode(value: Any, tensors: dict[str, torch.Tensor], memo: dict[int, int]) -> Any:
    """``value`` as JSON-ready data; tensors are moved into ``tensors`` (CPU copies) and referenced by key, a
    dataclass instance met again is stored as a reference (``memo``: id of the instance -> its number)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        value = _local(value)  # FSDP2 optimizer moments: this rank's shard (resuming FSDP2 is refused anyway)
        tensors[key] = value.detach().to("cpu", copy=True).contiguous()  # a copy: safetensors refuses shared memory
        return {TAG: "tensor", "key": key}
    if isinstance(value, list):
        return [encode(v, tensors, memo) for v in value]
    if isinstance(value, tuple):
        return {TAG: "tuple", "items": [encode(v, tensors, memo) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: encode(v, tensors, memo) for k, v in value.items()}
        items = [[encode(k, tensors, memo), encode(v, tensors, memo)] for k, v in value.items()]
        return {TAG: "dict", "items": items}
    if isinstance(value, np.ndarray) and value.dtype.kind in NUMPY_KINDS:
        return {TAG: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}
    if isinstance(value, np.generic) and value.dtype.kind in NUMPY_KINDS:
        return {TAG: "numpy", "dtype": value.dtype.str, "value": value.item()}
    if dataclasses.is_dataclass(value) and _state_type(type(value).__name__) is type(value):
        if id(value) in memo:
            return {TAG: "ref", "id": memo[id(value)]}
        fields = {f.name: encode(getattr(value, f.name), tensors, memo) for f in dataclasses.fields(value) if f.init}
        memo[id(value)] = len(memo)  # numbered once its fields are stored: the order decoding builds them in
        return {TAG: "dataclass", "name": type(value).__name__, "id": memo[id(value)], "fields": fields}
    raise TypeError(f"cannot store a {type(value).__module__}.{type(value).__qualname__} in the trainer state")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (safetensors stores plain tensors only); any other tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def decode(data: Any, tensors: dict[str, torch.Tensor], memo: dict[int, Any]) -> Any:
    """The inverse of :func:`encode` (``memo``: the dataclass instances built so far, by number)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v, tensors, memo) for v in data]
    if not isinstance(data, dict):
        raise StateFormatError(f"unexpected JSON value of type {type(data).__name__}")
    if TAG not in data:
        return {k: decode(v, tensors, memo) for k, v in data.items()}
    try:
        return _decode_tagged(data, tensors, memo)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, StateFormatError):
            raise
        raise StateFormatError(f"malformed {data.get(TAG)!r} entry in the trainer state ({exc!r})") from exc


def _decode_tagged(data: dict[str, Any], tensors: dict[str, torch.Tensor], memo: dict[int, Any]) -> Any:
    kind = data[TAG]
    if kind == "tensor":
        if data["key"] not in tensors:
            raise StateFormatError(f"the trainer state names a missing tensor {data['key']!r}")
        return tensors[data["key"]]
    if kind == "tuple":
        return tuple(decode(v, tensors, memo) for v in data["items"])
    if kind == "dict":
        return {_hashable(decode(k, tensors, memo)): decode(v, tensors, memo) for k, v in data["items"]}
    if kind in ("ndarray", "numpy"):
        dtype = np.dtype(data["dtype"])
        if dtype.kind not in NUMPY_KINDS:
            raise StateFormatError(f"numpy dtype {dtype} is not allowed in the trainer state")
        if kind == "numpy":
            return dtype.type(data["value"])
        count = math.prod(int(n) for n in data["shape"])
        values = data["data"]
        if not isinstance(values, list) or len(values) != count:
            raise StateFormatError("an ndarray's data does not match its shape")
        return np.array(values, dtype=dtype).reshape([int(n) for n in data["shape"]])
    if kind == "dataclass":
        cls = _state_type(str(data["name"]))
        if cls is None:
            raise StateFormatError(f"dataclass {data['name']!r} is not allowed in the trainer state")
        memo[len(memo)] = obj = cls(**{str(k): decode(v, tensors, memo) for k, v in data["fields"].items()})
        return obj
    if kind == "ref":
        if data["id"] not in memo:
            raise StateFormatError(f"the trainer state refers to an unknown object {data['id']!r}")
        return memo[data["id"]]
    raise StateFormatError(f"unknown entry type {kind!r} in the trainer state")


def _hashable(key: Any) -> Any:
    hash(key)  # TypeError (a malformed file) for a list or dict key
    return key
