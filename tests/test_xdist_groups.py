"""The suite's xdist groups reach pytest-xdist's scheduler (tests/conftest.py sets them; --dist loadgroup reads
them from the ``@GROUP`` suffix xdist puts on each node id). Regression: with pytest 9.2 and pytest-xdist 3.8.0
the suffix was never set (pytest 9.2 derives ``nodeid`` from ``Item._id``; xdist writes ``Item._nodeid``), so the
sandbox group was split over workers and the adversarial sandbox tests saw each other's processes
(pyproject pins pytest < 9.2)."""
from __future__ import annotations

import os

import pytest


def test_the_file_group_is_in_the_node_id_under_loadgroup(request):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("runs under pytest-xdist with --dist loadgroup (the default run); this run has -n 0")
    assert request.node.nodeid.endswith("@tests/test_xdist_groups.py"), request.node.nodeid


def test_a_sandbox_user_is_in_the_sandbox_group(request, sandbox):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("runs under pytest-xdist with --dist loadgroup (the default run); this run has -n 0")
    assert request.node.nodeid.endswith("@sandbox"), request.node.nodeid
