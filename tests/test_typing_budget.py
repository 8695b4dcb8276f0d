"""``Any`` is for values that really are arbitrary (a user reward's output, raw JSON at a
boundary, a third-party object without stubs); shapes the project defines travel as their
TypedDicts and dataclasses (docs/design.md §2, "Types"). The budget: at most 12 uses of ``Any``
per 1,000 non-blank lines of the installed packages, counted on the syntax tree (an annotation,
a cast, a subscript — every ``Any`` name a reader meets), so renaming the import does not hide one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("deepanalyze_env", "rewards", "tools")
BUDGET_PER_1000 = 12


def _any_uses(tree: ast.AST) -> int:
    aliases = {"Any"}
    for node in ast.walk(tree):  # `from typing import Any as A` counts A too
        if isinstance(node, ast.ImportFrom) and node.module == "typing":
            aliases |= {a.asname for a in node.names if a.name == "Any" and a.asname}
    return sum(
        (isinstance(node, ast.Name) and node.id in aliases)
        or (isinstance(node, ast.Attribute) and node.attr == "Any")
        for node in ast.walk(tree)
    )


def _count() -> tuple[int, int, dict[str, int]]:
    uses = lines = 0
    per_file: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            n = _any_uses(ast.parse(source))
            uses += n
            lines += sum(1 for line in source.splitlines() if line.strip())
            if n:
                per_file[str(path.relative_to(ROOT))] = n
    return uses, lines, per_file


def test_the_counter_sees_every_spelling_of_any():
    source = "\n".join(
        [
            "from typing import Any",
            "import typing",
            "from typing import Any as A",
            "x: Any",
            "y: typing.Any",
            "z: A",
        ]
    )
    assert _any_uses(ast.parse(source)) == 3


def test_any_stays_within_its_budget():
    uses, lines, per_file = _count()
    allowed = lines * BUDGET_PER_1000 // 1000
    worst = sorted(per_file.items(), key=lambda kv: -kv[1])[:8]
    assert uses <= allowed, f"{uses} uses of Any in {lines} lines (budget {allowed}); most in {worst}"
