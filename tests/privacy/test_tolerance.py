"""The budget comparisons' tolerance is defined once (p2pdp.privacy.tolerance), below every
module that compares spent to total epsilon: a second definition could drift from it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import p2pdp
from p2pdp.privacy import tolerance

PACKAGE = Path(p2pdp.__file__).parent


def _assigned(name: str) -> list[str]:
    """The modules of p2pdp that assign ``name`` at their top level."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            targets = (
                node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            )
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(path.relative_to(PACKAGE.parent).with_suffix("").as_posix())
    return found


def test_the_budget_tolerance_is_defined_once_and_every_comparison_reads_it():
    assert _assigned("BUDGET_TOLERANCE") == ["p2pdp/privacy/tolerance"]
    for name in ("accountants", "accounting", "clipped_gaussian", "gdp"):
        module = importlib.import_module(f"p2pdp.privacy.{name}")
        assert module.BUDGET_TOLERANCE is tolerance.BUDGET_TOLERANCE, name
