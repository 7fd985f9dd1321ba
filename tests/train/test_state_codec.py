"""The trainer-state codec's allow-list is a registry: owners register their state dataclasses, built-in owners are
found by module name (credo.train.state_codec.STATE_TYPES)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from credo.train import state_codec
from credo.train.state_codec import STATE_TYPES, StateFormatError, load_state, register_state_type, save_state
from credo.types import Rollouts, Trajectory

REPO = Path(__file__).resolve().parents[2]


@dataclass
class _PluginState:
    count: int


def test_a_fresh_process_loads_attnrl_trees_without_importing_attnrl_first(tmp_path: Path):
    from credo.methods.attnrl.algo import Tree, TreePath

    tree = Tree()
    tree.add(0)
    save_state({"paths": [TreePath(tree, (1,), ((0, 3),)), TreePath(tree, (1,), ((0, 3),))]}, tmp_path)
    code = ("import sys; from pathlib import Path; from credo.train.state_codec import load_state\n"
            "before = 'credo.methods.attnrl.algo' in sys.modules\n"
            "p = load_state(Path(sys.argv[1]))['paths']\n"
            "print(before, type(p[0]).__module__, p[0].tree is p[1].tree, p[0].tree.parents)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "credo.methods.attnrl.algo", "True", "[-1,", "0]"]


def test_an_unregistered_dataclass_is_refused_both_ways_until_registered(tmp_path: Path):
    with pytest.raises(TypeError, match="cannot store"):
        save_state({"x": _PluginState(1)}, tmp_path)
    save_state({"x": Rollouts([], [])}, tmp_path)
    doc = json.loads((tmp_path / state_codec.JSON_FILE).read_text())
    doc["state"]["x"]["name"] = "_PluginState"  # a file naming a class nobody registered
    (tmp_path / state_codec.JSON_FILE).write_text(json.dumps(doc))
    with pytest.raises(StateFormatError, match="'_PluginState' is not allowed"):
        load_state(tmp_path)
    register_state_type(_PluginState)
    try:
        save_state({"x": _PluginState(3)}, tmp_path)
        assert load_state(tmp_path) == {"x": _PluginState(3)}
    finally:
        STATE_TYPES.remove("_PluginState")


def test_only_dataclasses_register_and_a_name_is_one_class():
    with pytest.raises(TypeError, match="not a dataclass"):
        register_state_type(dict)
    other = dataclass(type("Trajectory", (), {"__annotations__": {"x": int}}))  # another class, a taken name
    with pytest.raises(ValueError, match="already registered"):
        register_state_type(other)
    assert STATE_TYPES.get("Trajectory") is Trajectory
    register_state_type(Trajectory)  # the same class again: a no-op
