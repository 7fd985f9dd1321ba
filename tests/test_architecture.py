"""Architecture guards over the source tree: credo's packages in layers (an import goes down the order or sideways,
never up, and no circle closes between packages), no import cycles between modules, no oversized functions, no
function with too many parameters.

All read the source with :mod:`ast` (nothing is imported), so they are fast and see every import, including
those inside functions and ``TYPE_CHECKING`` blocks (deferred imports still make two modules depend on each other).
"""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

import credo

SOURCE = Path(credo.__file__).parent
MAX_FUNCTION_LINES = 60
# the most parameters a function or method takes (``self`` / ``cls`` not counted, ``*args`` / ``**kwargs`` one each);
# past it, group them into an options dataclass. A function registered into a table (decorated by a ``register_*``
# call: losses, estimators, verifiers) counts only its inputs without a default: its keyword hyperparameters are
# its config surface, which the registry reads from the signature and checks the config against. 18 is today's
# largest (credo.sandbox.executor.execute); compute_advantages, VerifyEnv, train_crm / train_idrm are over 12.
MAX_PARAMETERS = 18

# credo's packages from the bottom up: a module may import a module of its own package, of a package in a lower
# layer, or of another package in its own layer as long as no circle closes. ``credo`` stands for the root modules
# (credo/types.py, errors.py, registry.py, ...); each credo/methods/<name> package is a package of the ``methods``
# layer. Lower packages reach higher ones only through registries that name their built-ins by module
# (credo.registry.Registry's ``builtins``), never by importing them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("credo",),
    ("tracking",),
    ("report",),  # the HTML report of a run directory: reads tracking's files only; a run writes it at the end
    ("algo",),
    ("config",),
    ("models",),
    ("guards",),
    ("data",),
    ("sandbox",),
    ("tools",),
    ("envs",),
    ("rewards",),
    ("rollout",),
    ("gateway",),  # the OpenAI-compatible gateway in front of the rollout engine (issue 35)
    ("train",),
    ("collect",),
    ("distributed",),
    ("recipes",),
    ("methods",),
    ("inspect", "plan"),
    ("cli",),
)
# (from package, to package) edges known to break the layers while their owners move them (issue 34): each must
# still exist (the test says when one is gone, so the entry goes too), and the set ends empty
PENDING: set[tuple[str, str]] = set()


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file for every module of the package at ``root`` (a package's ``__init__`` is the
    package's own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _package_of(name: str, path: Path) -> str:
    """The package that ``name``'s relative imports start from."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere in its file (module level, functions,
    methods, ``TYPE_CHECKING`` blocks). ``from pkg import x`` counts as importing ``pkg.x`` when that is a module,
    else ``pkg``; relative imports are resolved against the module's package."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name, path).split(".")
                anchor = ".".join(package[: len(package) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules (of the same package tree) it imports."""
    files = module_files(root)
    names = set(files)
    return {name: imported_modules(name, path, names) for name, path in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _code_lines(source: str, tree: ast.AST) -> set[int]:
    """Line numbers holding code: not blank, not only a comment, not part of a docstring."""
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.difference_update(range(first.lineno, first.end_lineno + 1))
    return lines


def function_sizes(path: Path) -> list[tuple[str, int]]:
    """(qualified name, code lines) of every function and method in the file, nested ones included (a nested
    function's lines count in the function around it too)."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    code = _code_lines(source, tree)
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((qual, sum(1 for n in range(child.lineno, child.end_lineno + 1) if n in code)))
                walk(child, qual + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _registered(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a decorator registers the function into a table (``@register_x(...)``, ``@TABLE.register(...)``)."""
    for dec in fn.decorator_list:
        call = dec.func if isinstance(dec, ast.Call) else dec
        name = call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", "")
        if name.startswith("register"):
            return True
    return False


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters the ceiling counts (see :data:`MAX_PARAMETERS`)."""
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    defaults = [None] * (len(a.posonlyargs) + len(a.args) - len(a.defaults)) + list(a.defaults) + list(a.kw_defaults)
    if _registered(fn):
        params = [p for p, d in zip(params, defaults) if d is None]
    return sum(1 for p in params if p.arg not in ("self", "cls")) + sum(x is not None for x in (a.vararg, a.kwarg))


def parameter_counts(path: Path) -> list[tuple[str, int]]:
    """(qualified name, parameters counted) of every function and method in the file (:func:`_parameters`)."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((qual, _parameters(child)))
                walk(child, qual + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), filename=str(path)), "")
    return out


def package_of(module: str, packages: set[str]) -> str:
    """The package a module belongs to for the layer rules, ``packages`` being the tree's package names (modules
    with submodules): ``credo.algo.losses.ppo`` -> ``algo``, ``credo.methods.attnrl.algo`` -> ``methods.attnrl``,
    a root module (``credo.types``, ``credo`` itself) -> ``credo``."""
    parts = module.split(".")
    if len(parts) == 1 or ".".join(parts[:2]) not in packages:
        return parts[0]
    if parts[1] == "methods" and len(parts) > 2:
        return f"methods.{parts[2]}"
    return parts[1]


def layer_of(package: str, layers=LAYERS) -> int:
    """The index of the package's layer in ``layers`` (a methods/<name> package is in the ``methods`` layer)."""
    top = package.partition(".")[0]
    for i, names in enumerate(layers):
        if top in names:
            return i
    raise AssertionError(f"package {package!r} is in no layer of tests/test_architecture.py's LAYERS: add it")


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(from package, to package) -> the module imports (``a -> b``) behind that edge, packages differing."""
    packages = {m.rpartition(".")[0] for m in graph}
    edges: dict[tuple[str, str], list[str]] = {}
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            pa, pb = package_of(a, packages), package_of(b, packages)
            if pa != pb:
                edges.setdefault((pa, pb), []).append(f"{a} -> {b}")
    return edges


def layer_violations(graph: dict[str, set[str]], layers=LAYERS
                     ) -> tuple[dict[tuple[str, str], list[str]], list[list[str]]]:
    """The package edges that go up the layer order (with the imports behind each), and the circles between
    packages (strongly connected components of the package graph, each sorted)."""
    edges = package_edges(graph)
    up = {e: imports for e, imports in edges.items() if layer_of(e[1], layers) > layer_of(e[0], layers)}
    package_graph: dict[str, set[str]] = {}
    for pa, pb in edges:
        package_graph.setdefault(pa, set()).add(pb)
    return up, import_cycles(package_graph)


# ------------------------------------------------------------------------------------------------- the guards

def test_packages_import_only_down_the_layers_and_close_no_circle():
    graph = import_graph(SOURCE)
    up, circles = layer_violations(graph)
    stale = sorted(PENDING - set(package_edges(graph)))
    assert not stale, f"PENDING names edges that no longer exist (drop them): {stale}"
    up = {e: imports for e, imports in up.items() if e not in PENDING}
    circles = [c for c in circles if not _pending_circle(c, graph)]
    lines = [f"{a} -> {b} goes up the layers: " + "; ".join(imports) for (a, b), imports in sorted(up.items())]
    lines += [f"circle between packages: {' <-> '.join(c)}" for c in circles]
    assert not lines, "layer order (low -> high) " + " < ".join(", ".join(n) for n in LAYERS) + ":\n" + "\n".join(lines)


def _pending_circle(component: list[str], graph: dict[str, set[str]]) -> bool:
    """Whether the circle opens once the PENDING edges are gone (then it is the PENDING entries' circle)."""
    edges = {e for e in package_edges(graph) if e[0] in component and e[1] in component and e not in PENDING}
    sub: dict[str, set[str]] = {}
    for a, b in edges:
        sub.setdefault(a, set()).add(b)
    return not import_cycles(sub)


def test_no_function_takes_too_many_parameters():
    offenders = [f"{path.relative_to(SOURCE.parent)}::{qual} ({n} parameters)"
                 for path in sorted(SOURCE.rglob("*.py")) for qual, n in parameter_counts(path)
                 if n > MAX_PARAMETERS]
    assert not offenders, f"functions over {MAX_PARAMETERS} parameters:\n" + "\n".join(offenders)


def test_no_import_cycles_between_credo_modules():
    cycles = import_cycles(import_graph(SOURCE))
    assert not cycles, "import cycles (each a set of modules importing one another):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_no_function_is_over_the_size_limit():
    offenders = [f"{path.relative_to(SOURCE.parent)}::{qual} ({n} code lines)"
                 for path in sorted(SOURCE.rglob("*.py")) for qual, n in function_sizes(path)
                 if n > MAX_FUNCTION_LINES]
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} code lines:\n" + "\n".join(offenders)


# ------------------------------------------------------------------------------------------------- the tools

def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_the_cycle_finder_reports_each_cycle_and_nothing_else(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.util import helper\nNAME = 1\n",
        "pkg/util.py": "import os\n\ndef helper():\n    return os.sep\n",
        # a <-> b: b's import is deferred into a function, and relative
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from . import a\n    return a\n",
        # sub.x -> sub.y -> sub.z -> sub.x, through a relative `from ..` and a name imported from a module
        "pkg/sub/__init__.py": "",
        "pkg/sub/x.py": "from .y import thing\n",
        "pkg/sub/y.py": "import pkg.sub.z\nthing = 1\n",
        "pkg/sub/z.py": "from ..sub.x import something\nfrom pkg import NAME\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.util"} and graph["pkg.util"] == set()
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.sub.z"] == {"pkg.sub.x", "pkg"}  # `from pkg import NAME`: NAME is no module -> pkg
    assert import_cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub.x", "pkg.sub.y", "pkg.sub.z"]]
    (pkg / "b.py").write_text("X = 1\n")  # break the first cycle
    assert import_cycles(import_graph(pkg)) == [["pkg.sub.x", "pkg.sub.y", "pkg.sub.z"]]


def test_function_sizes_leave_out_docstrings_comments_and_blank_lines(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    path = _write(tmp_path, {"pkg/m.py": (
        'def f():\n    """Doc\n\n    more doc."""\n    # a comment\n\n' + body + "\n    s = '''a\nb'''\n"
        "    return x0\n\n\nclass C:\n    def g(self):\n        def h():\n            return 1\n        return h\n")}) / "m.py"
    assert function_sizes(path) == [("f", 7), ("C.g", 4), ("C.g.h", 2)]


def test_the_layer_checker_reports_upward_imports_and_package_circles(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/types.py": "X = 1\n",  # a root module: the bottom layer
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from pkg.types import X\n\ndef f():\n    from pkg.high import b\n    return b\n",  # up
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "import pkg.low.a\n",
        "pkg/methods/__init__.py": "",
        "pkg/methods/x/__init__.py": "",
        "pkg/methods/x/m.py": "from pkg.methods.y import n\n",  # siblings in one layer: fine until a circle
        "pkg/methods/y/__init__.py": "",
        "pkg/methods/y/n.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.methods.x import m\n",
    })
    layers = (("pkg",), ("low",), ("high",), ("methods",))
    graph = import_graph(pkg)
    up, circles = layer_violations(graph, layers)
    assert up == {("low", "high"): ["pkg.low.a -> pkg.high.b"]}
    assert circles == [["high", "low"], ["methods.x", "methods.y"]]
    (pkg / "methods/y/n.py").write_text("import pkg.high.b\n")  # down: no circle left there
    (pkg / "low/a.py").write_text("from pkg.types import X\n")
    assert layer_violations(import_graph(pkg), layers) == ({}, [])
    with pytest.raises(AssertionError, match="'extra' is in no layer"):
        layer_of("extra", layers)


def test_parameter_counts_leave_out_self_and_a_registered_functions_hyperparameters(tmp_path):
    path = _write(tmp_path, {"pkg/m.py": (
        "def f(a, b=1, *args, c, d=2, **kw):\n    pass\n\n\n"
        "class C:\n    def g(self, x):\n        pass\n\n    @classmethod\n    def h(cls):\n        pass\n\n\n"
        "@register_loss('l', needs=('v',))\ndef loss(*, logprobs, mask, v=None, clip: float = 0.2, beta=0.1):\n"
        "    pass\n\n\n@TABLE.register('t')\ndef t(x, y=2):\n    pass\n\n\n"
        "@decorated\ndef u(x, y=2):\n    pass\n")}) / "m.py"
    assert parameter_counts(path) == [("f", 6), ("C.g", 1), ("C.h", 0), ("loss", 2), ("t", 1), ("u", 2)]


# the multi-stage paper methods (credo/methods/*) and their section / option names: the RL recipe reaches them
# only through the stages (credo.recipes.stages) and the registries
METHOD_WORDS = ("attnrl", "tree", "rlep", "replay", "vepo", "grounding", "birm", "agentic", "verifier", "fci",
                "distill", "teacher", "dfpo", "dvpo", "vrpo")
# the step and what decides its passes: generic code that reaches a method only through the registries
STEP_FILES = ("recipes/step.py", "recipes/rlvr.py", "recipes/stages.py", "train/plan.py", "train/update.py",
              "train/loss_terms.py", "train/transforms.py")


@pytest.mark.parametrize("name", STEP_FILES)
def test_the_step_names_no_method(name):
    source = (SOURCE / name).read_text()
    names = [tok.string.lower() for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.NAME]
    hits = sorted({n for n in names for w in METHOD_WORDS if w in n})
    assert hits == [], f"credo/{name} names paper methods in its code: {hits}"


def test_the_step_file_stays_a_readable_list():
    source = (SOURCE / "recipes" / "step.py").read_text()
    assert len(source.splitlines()) <= 300, "credo/recipes/step.py grew past ~300 lines: move a stage's body out"
    assert len((SOURCE / "recipes" / "rlvr.py").read_text().splitlines()) <= 420
