"""References in credo's sources point into the repository, and every registered formula is written down.

- No file under ``credo/`` cites the design notes the implementation was written from (``../shared/spec/...``,
  ``seeds/``, the spec's file names): those are not part of the repository. Sources cite ``docs/``.
- Every ``docs/....md`` path cited under ``credo/`` exists, and so does the heading its ``#anchor`` names.
- Every registered policy loss, advantage estimator and critic loss states its formula in its docstring and cites a
  ``docs/algorithms/`` page (in its docstring or its module's) that exists and documents that name.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "credo"

# The design notes' locations and file names (none of them is in the repository).
OUT_OF_TREE = re.compile(r"shared/spec|\.\./shared|\bseeds/|\bspec/README|seed-algorithms\.md|seed-additions\.md|"
                         r"\bbaselines\.md|agents-and-sandboxes\.md")
# A docs path as credo cites it: at the start of a word (not verl's ``verl/docs/...``), with an optional anchor.
DOCS_PATH = re.compile(r"(?<![\w/.-])(docs/[\w./-]+?\.md)(#[\w-]+)?")
ALGO_PAGE = re.compile(r"(?<![\w/.-])docs/algorithms/[\w.-]+\.md")
# A formula line: a math name (optionally subscripted or with arguments) '=' an expression that holds an operator (not a
# word's hyphen), a function call or one of the functions the formulas use, e.g. ``L = -A r``,
# ``A_i = (R_i - mean_g R) / (std_g R + eps)``.
FORMULA_LHS = re.compile(r"(?:^|[\s;:(])[A-Za-z][\w'~^{}]*(?:_\{?[\w,]+\}?)?(?:\([^()=]*\))?\s*=(?!=)\s*([^=;]+)")
FORMULA_RHS = re.compile(r"(?:^|\s|\()[-+*/^]|\w\(|[\w)\]][*/^]|\b(?:exp|log|min|max|clip|clamp|sum|mean|sqrt|sigmoid|whiten|gae|"
                         r"std|sg)\b")


def text_files(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
            and p.suffix in {".py", ".md", ".txt", ".yaml", ".yml", ".json", ".toml", ".cfg"}]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def has_formula(doc: str) -> bool:
    return any(FORMULA_RHS.search(m.group(1)) for line in doc.splitlines() for m in FORMULA_LHS.finditer(line))


def registered() -> list[tuple[str, str, object]]:
    """(kind, name, function) for every registered policy loss, advantage estimator and critic loss, read through the
    public listings (so entries registered by method packages or plugins' built-in modules are included)."""
    import credo.algo as algo
    from credo.algo import critic
    from credo.algo.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    out = []
    for kind, names, table in (("policy loss", algo.list_policy_losses(), POLICY_LOSSES),
                               ("advantage estimator", algo.list_advantage_estimators(), ADVANTAGE_ESTIMATORS),
                               ("critic loss", critic.list_critic_losses(), critic.CRITIC_LOSSES)):
        for name in names:
            entry = table.get(name)
            out.append((kind, name, getattr(entry, "fn", entry)))
    return out


def test_formula_detector_tells_formulas_from_prose():
    assert has_formula("PPO-clip.\n\n    L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))")
    assert has_formula("GRPO: A_i = (R_i - mean_g R) / (std_g R + eps), std unbiased")
    assert has_formula("L_t = 1/2 max((V_t - Ret_t)^2, (clip(V_t, V_old - k, V_old + k) - Ret_t)^2)")
    assert not has_formula("Group advantages reweighted per entropy-polarity branch (module docstring).")
    assert not has_formula("Defaults: ``kl_on=\"all\"``, gate = batch.")
    assert has_formula("KL-Cov: no clipping, L = -A r, plus ppo_kl_coef |delta| on the top-k covariance tokens.")
    assert not has_formula("if x == y: return")
    assert not has_formula("eps = low_entropy_clip on low-entropy tokens, high_entropy_clip on the top-20% ones.")


def test_no_source_cites_the_out_of_tree_design_notes():
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in text_files(PACKAGE)
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUT_OF_TREE.search(line)]
    assert not hits, "cite docs/ (docs/algorithms/<page>.md) instead:\n" + "\n".join(hits)


def test_every_cited_docs_page_and_anchor_exists():
    cited = [(p, i, m.group(1), m.group(2)) for p in text_files(PACKAGE)
             for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             for m in DOCS_PATH.finditer(line)]
    assert any(path.startswith("docs/algorithms/") for _, _, path, _ in cited)  # the scan sees the citations
    missing = [f"{p.relative_to(ROOT)}:{i}: {path}{anchor or ''}" for p, i, path, anchor in cited
               if not (ROOT / path).is_file() or (anchor and anchor[1:] not in anchors(ROOT / path))]
    assert not missing, "cited docs pages or headings that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("kind,name,fn", registered(), ids=lambda x: x if isinstance(x, str) else "")
def test_registered_function_states_its_formula_and_cites_its_page(kind, name, fn):
    doc = inspect.getdoc(fn) or ""
    assert has_formula(doc), f"{kind} {name!r} ({fn.__module__}.{fn.__qualname__}): no formula line in its docstring"
    pages = ALGO_PAGE.findall(doc) or ALGO_PAGE.findall(inspect.getmodule(fn).__doc__ or "")
    assert pages, f"{kind} {name!r}: neither its docstring nor its module's cites a docs/algorithms/ page"
    for page in pages:
        assert (ROOT / page).is_file(), f"{kind} {name!r} cites {page}, which does not exist"
    texts = [(ROOT / page).read_text() for page in pages]
    assert any(f"`{name}`" in t or f": {name}`" in t for t in texts), \
        f"{kind} {name!r}: none of its cited pages ({', '.join(pages)}) documents the name `{name}`"
