"""The layer rules (docs/design.md, "Layout"), checked on every module's imports — including
imports inside functions, which are how optional dependencies are reached.

- ``rewards`` and ``tools`` never import trainer, offline or CLI code; ``tools`` (the kernel
  side) imports neither ``deepanalyze_env`` nor ``rewards``.
- the core imports no trainer, offline tool or CLI module; trainers and offline tools import
  no CLI module; trainers and offline tools do not import each other.
- ``core.protocol`` and ``core.errors`` import where skyrl_gym is not installed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package prefix of the importing module → import prefixes it must not use
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "tools": ("deepanalyze_env", "rewards"),
    "rewards": ("deepanalyze_env.trainers", "deepanalyze_env.offline", "deepanalyze_env.cli"),
    "deepanalyze_env.core": ("deepanalyze_env.trainers", "deepanalyze_env.offline", "deepanalyze_env.cli"),
    "deepanalyze_env.trainers": ("deepanalyze_env.offline", "deepanalyze_env.cli"),
    "deepanalyze_env.offline": ("deepanalyze_env.trainers", "deepanalyze_env.cli"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(name: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement of module ``name``, absolute or relative."""
    tree = ast.parse(source, filename=name)
    package = name if is_package else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _modules() -> list[Path]:
    return sorted(p for pkg in ("deepanalyze_env", "rewards", "tools") for p in (ROOT / pkg).rglob("*.py"))


def _violations_in(name: str, source: str, shown: str, is_package: bool = False) -> list[str]:
    bad = []
    for prefix, banned in FORBIDDEN.items():
        if name != prefix and not name.startswith(prefix + "."):
            continue
        for line, imported in _imports(name, source, is_package):
            for ban in banned:
                if imported == ban or imported.startswith(ban + "."):
                    bad.append(f"{shown}:{line} imports {imported} ({prefix} must not)")
    return sorted(set(bad))


def _violations(path: Path) -> list[str]:
    return _violations_in(
        _module_name(path),
        path.read_text(encoding="utf-8"),
        str(path.relative_to(ROOT)),
        path.name == "__init__.py",
    )


def test_no_module_breaks_a_layer_rule():
    bad = [v for path in _modules() for v in _violations(path)]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_violation_inside_a_function():
    """Negative control: the rule must catch what it is meant to catch, lazily imported or not."""
    source = "def f():\n    from deepanalyze_env.cli.common import console\n    return console\n"
    found = _violations_in("deepanalyze_env.core.probe", source, "probe.py")
    assert "probe.py:2 imports deepanalyze_env.cli.common (deepanalyze_env.core must not)" in found
    assert _violations_in("deepanalyze_env.cli.probe", source, "probe.py") == []  # the CLI may


@pytest.mark.parametrize("module", ["deepanalyze_env.core.protocol", "deepanalyze_env.core.errors"])
def test_protocol_and_errors_import_without_skyrl_gym(module):
    code = (
        "import sys\n"
        "sys.modules['skyrl_gym'] = sys.modules['skyrl'] = None  # as if not installed\n"
        f"import {module}\n"
        "assert sys.modules['skyrl_gym'] is None\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
