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


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement, absolute or relative."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
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


def _violations(path: Path) -> list[str]:
    name = _module_name(path)
    bad = []
    for prefix, banned in FORBIDDEN.items():
        if name != prefix and not name.startswith(prefix + "."):
            continue
        for line, imported in _imports(path):
            for ban in banned:
                if imported == ban or imported.startswith(ban + "."):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported} ({prefix} must not)")
    return sorted(set(bad))


def test_no_module_breaks_a_layer_rule():
    bad = [v for path in _modules() for v in _violations(path)]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_violation_inside_a_function():
    """Negative control: the rule must catch what it is meant to catch, lazily imported or not."""
    core = ROOT / "deepanalyze_env" / "core"
    probe = core / "_layer_probe_tmp.py"
    probe.write_text("def f():\n    from deepanalyze_env.cli.common import console\n    return console\n")
    try:
        assert "deepanalyze_env/core/_layer_probe_tmp.py:2 imports deepanalyze_env.cli.common " + (
            "(deepanalyze_env.core must not)"
        ) in _violations(probe)
    finally:
        probe.unlink()


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
