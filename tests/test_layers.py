"""The layer rules (docs/design.md, "Layout"), checked on every module's imports — including
imports inside functions, which are how optional dependencies are reached.

- ``rewards`` and ``tools`` never import trainer, offline or CLI code; ``tools`` (the kernel
  side) imports neither ``deepanalyze_env`` nor ``rewards``.
- the core imports no generation, trainer, offline tool, pipeline or CLI module, and neither
  torch, transformers nor TRL (not even inside a function): what needs them is the generation
  layer's. The generation layer imports no trainer, offline tool, serve, pipeline, CLI or reward
  module. Trainers and offline tools import no pipeline or CLI module and not each other; the
  learn pipeline (above both, it chains their commands) imports no CLI module.
- ``serve`` (the env to outside clients) sits above the core and the offline tools and below the
  CLI: it imports no trainer, pipeline or CLI module, and nothing but the CLI imports it.
- ``core.protocol`` and ``core.errors`` import where skyrl_gym is not installed.
- where a turn ends has one owner, ``generation/turn_end.py``: it alone reads the stop lists to
  stop a turn, and the engine, both TRL backends and SkyRL's stop settings import it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package prefix of the importing module → import prefixes it must not use
UPPER = ("deepanalyze_env.learn", "deepanalyze_env.cli")
SERVE = "deepanalyze_env.serve"  # above core and offline, below the CLI: nothing else imports it
GENERATION = "deepanalyze_env.generation"  # between core and its users: models, tokens, turn ends
MODEL_LIBRARIES = ("torch", "transformers", "trl")  # the generation layer's, never the core's
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "tools": ("deepanalyze_env", "rewards"),
    "rewards": ("deepanalyze_env.trainers", "deepanalyze_env.offline", SERVE, *UPPER),
    "deepanalyze_env.core": (
        GENERATION,
        *MODEL_LIBRARIES,
        "deepanalyze_env.trainers",
        "deepanalyze_env.offline",
        SERVE,
        *UPPER,
    ),
    GENERATION: ("deepanalyze_env.trainers", "deepanalyze_env.offline", SERVE, *UPPER, "rewards", "tools"),
    "deepanalyze_env.trainers": ("deepanalyze_env.offline", SERVE, *UPPER),
    "deepanalyze_env.offline": ("deepanalyze_env.trainers", SERVE, *UPPER),
    "deepanalyze_env.learn": ("deepanalyze_env.cli", SERVE),
    "deepanalyze_env.serve": ("deepanalyze_env.trainers", *UPPER),
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


def test_the_checker_sees_the_core_reach_for_torch_inside_a_function():
    source = "def f():\n    import torch.nn\n    from transformers import AutoTokenizer\n"
    found = _violations_in("deepanalyze_env.core.probe", source, "probe.py")
    assert "probe.py:2 imports torch.nn (deepanalyze_env.core must not)" in found
    assert "probe.py:3 imports transformers (deepanalyze_env.core must not)" in found
    assert _violations_in("deepanalyze_env.generation.probe", source, "probe.py") == []


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


# ---------------------------------------------------------------------------- one owner per rule


# A rule's value set, and the one module allowed to spell it out; everything else imports it.
def _owned_values() -> dict[str, tuple[frozenset[str], str]]:
    from deepanalyze_env.core.config import CACHE_JOURNALS, JUDGE_BACKENDS
    from deepanalyze_env.core.contracts import EXEC_STATUSES, REWARD_STATUSES, TERMINATIONS
    from deepanalyze_env.core.protocol import STOP_TAGS
    from rewards import ACCURACY_COMPONENTS

    contracts, config = "deepanalyze_env/core/contracts.py", "deepanalyze_env/core/config.py"
    return {
        "reward statuses": (frozenset(REWARD_STATUSES), contracts),
        "terminations": (frozenset(TERMINATIONS), contracts),
        "exec statuses": (frozenset(EXEC_STATUSES), contracts),
        "judge backends": (frozenset(JUDGE_BACKENDS), config),
        "judge cache journals": (frozenset(CACHE_JOURNALS), config),
        "accuracy components": (frozenset(ACCURACY_COMPONENTS), "rewards/answers.py"),
        "stop tags": (frozenset(STOP_TAGS), "deepanalyze_env/core/protocol.py"),
    }


# Functions and types that own a rule: defined at the top level of exactly this module.
OWNED_NAMES = {
    "token_rules": "deepanalyze_env/generation/tag_tokens.py",
    "tag_stop_ids": "deepanalyze_env/generation/tag_tokens.py",
    "TokenRules": "deepanalyze_env/generation/tag_tokens.py",
    "PROTOCOL_TAGS": "deepanalyze_env/generation/tag_tokens.py",
    "split_turn": "deepanalyze_env/generation/turn_end.py",
    "completes_stop": "deepanalyze_env/generation/turn_end.py",
    "stop_candidates": "deepanalyze_env/generation/turn_end.py",
    "turn_stops": "deepanalyze_env/generation/turn_end.py",
    "TurnStops": "deepanalyze_env/generation/turn_end.py",
    "TurnEnd": "deepanalyze_env/core/driver.py",
    "trainable": "deepanalyze_env/core/contracts.py",
    "numbers_equal": "rewards/normalize.py",
    "dabench_equal": "rewards/normalize.py",
    "group_variance": "deepanalyze_env/trainers/curriculum.py",
    "own_turn_indices": "deepanalyze_env/core/records.py",
}


def _string_collections(tree: ast.AST):
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Literal"
        ):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            elts = node.elts
        else:
            continue
        if len(elts) >= 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
            yield node.lineno, frozenset(e.value for e in elts)


def test_every_rule_is_spelled_out_in_one_module():
    owned = _owned_values()
    bad = []
    for path in _modules():
        shown = str(path.relative_to(ROOT))
        for line, values in _string_collections(ast.parse(path.read_text(encoding="utf-8"))):
            for rule, (want, owner) in owned.items():
                if values == want and shown != owner:
                    bad.append(f"{shown}:{line} spells out the {rule} (import them from {owner})")
    assert not bad, "\n".join(bad)


def test_rule_functions_are_defined_only_by_their_owner():
    defined: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            for name in names:
                if name in OWNED_NAMES:
                    defined.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {name: where for name, where in defined.items() if where != [OWNED_NAMES[name]]} == {}
    assert set(defined) == set(OWNED_NAMES)  # every owner still defines its rule


# ---------------------------------------------------------------------------- where a turn ends

TURN_END = "deepanalyze_env/generation/turn_end.py"
STOP_LISTS = {"STOP_TAGS", "STOP_STRINGS"}  # core.protocol's closing tags, core.tool_calls' call end
# Modules that may read the stop lists without deciding where a turn ends, and why.
STOP_LIST_READERS = {
    "deepanalyze_env/core/protocol.py": "defines the tags; the env truncates an action at them",
    "deepanalyze_env/core/tool_calls.py": "defines the tools format's call end; the env truncates at it",
    "deepanalyze_env/generation/tag_tokens.py": "which closing tags a tokenizer holds as one token",
    "deepanalyze_env/core/formats/tags.py": "a format names its stop strings (turn_end applies them)",
    "deepanalyze_env/core/formats/tools.py": "a format names its stop strings (turn_end applies them)",
}
# Who applies the rule, and what each imports from its owner.
TURN_END_USERS = {
    "deepanalyze_env/generation/engine.py": {"completes_stop", "stop_candidates"},
    "deepanalyze_env/trainers/trl/rollout_func.py": {"split_turn"},
    "deepanalyze_env/trainers/trl/turns.py": {"turn_stops"},
    "deepanalyze_env/trainers/trl/train.py": {"turn_stops"},
    "deepanalyze_env/trainers/skyrl/config.py": {"turn_stops"},
    "deepanalyze_env/offline/policies.py": {"turn_stops"},
}


def _stop_list_reads(source: str) -> list[int]:
    """Lines of ``source`` that read a stop list: by name, by attribute or by import."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names = {node.id}
        elif isinstance(node, ast.Attribute):
            names = {node.attr}
        elif isinstance(node, ast.ImportFrom):
            names = {alias.name for alias in node.names}
        else:
            continue
        if names & STOP_LISTS:
            lines.add(node.lineno)
    return sorted(lines)


def test_only_the_turn_end_owner_reads_the_stop_lists_to_end_a_turn():
    bad = []
    for path in _modules():
        shown = str(path.relative_to(ROOT))
        if shown == TURN_END or shown in STOP_LIST_READERS:
            continue
        for line in _stop_list_reads(path.read_text(encoding="utf-8")):
            bad.append(f"{shown}:{line} reads a stop list (use generation.turn_end: split_turn, turn_stops)")
    assert not bad, "\n".join(bad)
    assert _stop_list_reads((ROOT / TURN_END).read_text(encoding="utf-8"))  # the owner does read them


def test_the_stop_list_check_sees_a_second_stop_rule():
    """Negative control: a helper that decides a turn's end by the tags itself is caught."""
    source = (
        "from deepanalyze_env.core import protocol\n"
        "def ends(text):\n"
        "    return any(tag in text for tag in protocol.STOP_TAGS)\n"
    )
    assert _stop_list_reads(source) == [3]


def test_every_generation_path_takes_its_turn_end_from_the_owner():
    missing = []
    for shown, names in TURN_END_USERS.items():
        path = ROOT / shown
        imported = {
            alias.name
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module == "deepanalyze_env.generation.turn_end"
            for alias in node.names
        }
        if not names <= imported:
            missing.append(f"{shown} does not import {sorted(names - imported)} from generation.turn_end")
    assert not missing, "\n".join(missing)


def test_every_public_class_says_why_it_exists():
    missing = []
    for path in _modules():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (
                isinstance(node, ast.ClassDef)
                and not node.name.startswith("_")
                and not ast.get_docstring(node)
            ):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not missing, "public classes without a docstring:\n" + "\n".join(missing)


def test_no_command_imports_another_except_the_shared_helpers():
    """Commands are thin: what two commands share lives below them (``offline``, ``core``) or in
    ``cli/common``; ``app`` and the package entry point only dispatch."""
    bad = []
    for path in sorted((ROOT / "deepanalyze_env" / "cli").glob("*.py")):
        if path.name in ("app.py", "__init__.py", "__main__.py"):
            continue
        name = _module_name(path)
        for line, imported in _imports(name, path.read_text(encoding="utf-8")):
            other = imported.startswith("deepanalyze_env.cli.") and not imported.startswith(name)
            if other and not imported.startswith("deepanalyze_env.cli.common"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not bad, "\n".join(bad)


MODULE_LINES = 650  # the layout's bound; a longer module says why in its docstring
FUNCTION_LINES = 100
SIZE_REASON = "Why one module over 650 lines:"


def _long_functions(source: str) -> list[tuple[int, str, int]]:
    """(line, name, length) of every function in ``source`` longer than FUNCTION_LINES."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > FUNCTION_LINES:
                found.append((node.lineno, node.name, lines))
    return found


def test_no_function_is_longer_than_100_lines():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for path in _modules()
        for line, name, n in _long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not long, "functions over 100 lines (split them):\n" + "\n".join(long)


def test_a_module_over_650_lines_says_why_in_its_docstring():
    unexplained = []
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MODULE_LINES and SIZE_REASON not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, f"modules over {MODULE_LINES} lines without '{SIZE_REASON}':\n" + "\n".join(
        unexplained
    )


def test_the_size_check_sees_a_long_method_and_passes_a_short_one():
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LINES))
    source = f"class C:\n    def long(self):\n{body}\n\n    def short(self):\n        return 1\n"
    assert _long_functions(source) == [(2, "long", FUNCTION_LINES + 1)]


def test_every_cited_spec_section_exists():
    """``docs/design.md §N`` in code names a numbered heading the spec has (the old "contract N"
    numbering is gone)."""
    import re

    spec = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    sections = {m.group(1) for m in re.finditer(r"^## (\d+)\. ", spec, re.M)}
    bad = []
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"design\.md §(\d+)", text):
            if m.group(1) not in sections:
                bad.append(f"{path.relative_to(ROOT)} cites §{m.group(1)}")
        if re.search(r"DESIGN contract|\bcontract \d\b", text):
            bad.append(f"{path.relative_to(ROOT)} cites a 'contract N' numbering the spec no longer has")
    assert not bad, "\n".join(bad)
