"""Architecture guards over the source tree: no import cycles between credo's modules, no oversized functions.

Both read the source with :mod:`ast` (nothing is imported), so they are fast and see every import, including
those inside functions (deferred imports still make two modules depend on each other).
"""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import credo

SOURCE = Path(credo.__file__).parent
MAX_FUNCTION_LINES = 60


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


# ------------------------------------------------------------------------------------------------- the guards

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


# the multi-stage paper methods (credo/methods/*) and their section / option names: the RL recipe reaches them
# only through the stages (credo.recipes.stages) and the registries
METHOD_WORDS = ("attnrl", "tree", "rlep", "replay", "vepo", "grounding", "birm", "agentic", "verifier", "fci")


def test_the_rl_recipe_names_no_method_and_stays_short():
    path = SOURCE / "recipes" / "rlvr.py"
    source = path.read_text()
    assert len(source.splitlines()) <= 420, "credo/recipes/rlvr.py grew past ~400 lines: move a stage out"
    names = [tok.string.lower() for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.NAME]
    hits = sorted({n for n in names for w in METHOD_WORDS if w in n})
    assert hits == [], f"credo/recipes/rlvr.py names paper methods in its code: {hits}"
