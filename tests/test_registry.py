"""credo.registry: the one registry mechanism (lookup with suggestions, listing, lazy built-ins)."""
from __future__ import annotations

import sys
import types

import pytest

from credo.registry import Registry, UnknownName


def test_lookup_suggests_the_close_name_and_lists_the_rest():
    r = Registry("widget")
    r.add("alpha", 1)
    r.add("beta", 2)
    assert r.get("alpha") == 1 and "beta" in r and r.names() == ["alpha", "beta"]
    with pytest.raises(UnknownName) as e:
        r.get("alpah")
    assert "did you mean 'alpha'" in str(e.value) and "registered: alpha, beta" in str(e.value)
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)


def test_a_different_entry_under_a_taken_name_is_refused_the_same_one_is_not():
    r = Registry("widget")

    @r.register("f")
    def f():
        pass

    r.add("f", f)  # the same definition again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        r.add("f", lambda: None)


def test_builtins_are_imported_on_first_lookup_only(monkeypatch):
    r = Registry("widget", builtins=("credo_test_builtin_widgets",))
    imported = []
    mod = types.ModuleType("credo_test_builtin_widgets")
    monkeypatch.setitem(sys.modules, "credo_test_builtin_widgets", mod)
    real = __import__("importlib").import_module

    def spy(name, *a):
        imported.append(name)
        if name == "credo_test_builtin_widgets":
            r.add("builtin", 7)
            return mod
        return real(name, *a)

    monkeypatch.setattr("credo.registry.importlib.import_module", spy)
    r.add("mine", 1)
    assert r.get("mine") == 1 and imported == []  # a registered name never triggers the built-ins
    assert r.get("builtin") == 7 and imported == ["credo_test_builtin_widgets"]
    assert r.names() == ["builtin", "mine"] and imported == ["credo_test_builtin_widgets"]  # imported once


def test_two_instances_of_one_class_are_different_entries():
    """An instance carries its class's ``__module__`` but no ``__qualname__``: only the same object is the same."""
    r = Registry("spec")
    first = types.SimpleNamespace(x=1)
    r.add("s", first)
    r.add("s", first)
    with pytest.raises(ValueError, match="already registered"):
        r.add("s", types.SimpleNamespace(x=2))


def test_refuse_taken_checks_a_name_without_importing_the_builtins():
    r = Registry("widget", builtins=("credo_test_no_such_module",))
    r.add("f", test_refuse_taken_checks_a_name_without_importing_the_builtins)
    r.refuse_taken("free", 1)  # no import of the (missing) built-in module, no error
    with pytest.raises(ValueError, match=r"widget 'f' is already registered \(to tests\.test_registry\."):
        r.refuse_taken("f", 2)


# every name -> entry table of credo's pluggable choices, and one built-in each (found without importing its module)
TABLES = [("credo.algo.registry", "POLICY_LOSSES", "ppo"), ("credo.algo.registry", "ADVANTAGE_ESTIMATORS", "grpo"),
          ("credo.algo.critic", "CRITIC_LOSSES", "clipped_mse"), ("credo.rewards.registry", "REWARDS", "humaneval"),
          ("credo.envs.base", "ENVS", "verify"), ("credo.envs.base", "PREFIXES", "agentgym:"),
          ("credo.envs.agentgym", "ADAPTERS", "textcraft"), ("credo.data.tasks", "TASKS", "humaneval"),
          ("credo.tools.parsers", "PARSERS", "qwen3_coder"), ("credo.models.value", "CRITIC_HEADS", "flow"),
          ("credo.methods.vepo.grounding", "PERTURBATIONS", "shuffle"),
          ("credo.methods.vepo.image", "IMAGE_PERTURBATIONS", "patch_blacken"),
          ("credo.inspect.regions", "REGION_FNS", "gmpo")]


@pytest.mark.parametrize(("module", "attr", "builtin"), TABLES, ids=[t[1] for t in TABLES])
def test_every_table_is_a_registry_that_lists_its_builtins(module, attr, builtin):
    table = getattr(__import__("importlib").import_module(module), attr)
    assert isinstance(table, Registry)
    assert builtin in table.names() and table.get(builtin) is table[builtin]
    with pytest.raises(UnknownName, match=f"unknown {table.kind} 'zz_no_such'.*; registered: .*{builtin}"):
        table.get("zz_no_such")
