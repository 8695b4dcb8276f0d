"""Recipe files (docs/design.md §10): YAML with ``backend``, ``output_dir``, ``max_steps``,
``model``, ``data``, ``env``, ``rollout``, ``trl``, ``skyrl``, ``sft``, ``curriculum``; ``key=value``
overrides on top.

``backend: trl-sft`` is the SFT warm start: ``data`` names episode records (files or run
folders), ``sft`` selects them (``keep``, ``statuses``) and ``trl`` holds ``SFTConfig`` settings.

``curriculum: {kind: success_rate, …}`` (off unless set; backends ``trl`` and ``skyrl``) samples
tasks by their success estimate (``trainers/curriculum.py`` documents every field).

Overrides use dotted keys (``env.judge.base_url=http://…``) and YAML scalars (``max_steps=2``).
Top-level keys are checked here; ``env`` is checked by ``EnvConfig`` and ``trl`` by
``GRPOConfig`` itself, so a typo anywhere is an error naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.trainers.curriculum import CurriculumConfig

TOP_LEVEL = (
    "backend",
    "output_dir",
    "max_steps",
    "model",
    "data",
    "env",
    "rollout",
    "trl",
    "skyrl",
    "sft",
    "curriculum",
    "chat_template",
)
ROLLOUT_KEYS = ("max_turn_tokens", "score_truncated", "env_workers", "budget_check")
SFT_KEYS = ("keep", "statuses")
BACKENDS = ("trl", "skyrl", "trl-sft")
CURRICULUM_BACKENDS = ("trl", "skyrl")


@dataclass
class Recipe:
    """A validated recipe file (docs/design.md §10): every section a backend reads, checked before
    anything runs."""

    backend: str
    output_dir: str
    max_steps: int
    model: str
    data: list[str]
    env: JsonObject = field(default_factory=dict)  # env_config, checked by EnvConfig
    rollout: JsonObject = field(default_factory=dict)  # ROLLOUT_KEYS
    trl: JsonObject = field(default_factory=dict)  # GRPOConfig / SFTConfig settings, checked by TRL
    skyrl: JsonObject = field(default_factory=dict)  # SkyRL overrides, checked by SkyRL
    sft: JsonObject = field(default_factory=dict)  # SFT_KEYS
    curriculum: CurriculumConfig | None = None
    chat_template: str | None = None
    """The tokenizer's chat template: a Jinja file (relative paths from the recipe's folder) or
    ``trl:NAME`` for one TRL ships (``trl/chat_templates/NAME.jinja``, e.g. ``trl:qwen3``); None
    keeps the model's own. ``env.action_format: tools`` needs one that renders tool calls."""
    source: str = ""

    def chat_template_text(self) -> str | None:
        """The template's text, or None when the recipe keeps the model's own."""
        if self.chat_template is None:
            return None
        from deepanalyze_env.generation.chat_templates import chat_template_text

        base = Path(self.source).parent if self.source else None
        return chat_template_text(self.chat_template, base, f"{self.source}: chat_template")


def apply_override(tree: JsonObject, assignment: str) -> None:
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like key=value (e.g. max_steps=2)")
    dotted, _, raw = assignment.partition("=")
    keys = [k for k in dotted.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"override {assignment!r} has an empty key")
    value = yaml.safe_load(raw) if raw.strip() else ""
    if isinstance(value, str):  # YAML 1.1 reads "1e-5" as text; on a command line it means a number
        try:
            value = float(value)
        except ValueError:
            pass
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {key} is not a section")
        node = child
    node[keys[-1]] = value


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe file not found: {path}")
    tree = yaml.safe_load(path.read_text()) or {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: a recipe is a mapping at the top level")
    for assignment in overrides or []:
        apply_override(tree, assignment)
    unknown = [k for k in tree if k not in TOP_LEVEL]
    if unknown:
        raise ConfigError(f"{path}: unknown recipe key {unknown[0]!r} (known: {', '.join(TOP_LEVEL)})")
    missing = [k for k in ("backend", "output_dir", "model", "data") if k not in tree]
    if missing:
        raise ConfigError(f"{path}: recipe key {missing[0]!r} is required")
    if tree["backend"] not in BACKENDS:
        raise ConfigError(f"{path}: backend must be one of {', '.join(BACKENDS)}, got {tree['backend']!r}")
    data = tree["data"]
    data = [data] if isinstance(data, str) else list(data)
    for section in ("env", "rollout", "trl", "skyrl", "sft"):
        if not isinstance(tree.get(section) or {}, dict):
            raise ConfigError(f"{path}: {section} must be a mapping")
    rollout = dict(tree.get("rollout") or {})
    bad = [k for k in rollout if k not in ROLLOUT_KEYS]
    if bad:
        raise ConfigError(f"{path}: unknown key rollout.{bad[0]} (known: {', '.join(ROLLOUT_KEYS)})")
    sft = dict(tree.get("sft") or {})
    bad = [k for k in sft if k not in SFT_KEYS]
    if bad:
        raise ConfigError(f"{path}: unknown key sft.{bad[0]} (known: {', '.join(SFT_KEYS)})")
    curriculum = None
    if tree.get("curriculum") is not None:
        curriculum = CurriculumConfig.from_mapping(tree["curriculum"], str(path))
        if tree["backend"] not in CURRICULUM_BACKENDS:
            raise ConfigError(
                f"{path}: curriculum is supported on backends {' and '.join(CURRICULUM_BACKENDS)} "
                f"(got {tree['backend']}: it samples GRPO groups)"
            )
    env = dict(tree.get("env") or {})
    EnvConfig.from_any(env)
    try:
        max_steps = int(tree.get("max_steps", -1))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: max_steps must be an integer")
    return Recipe(
        backend=tree["backend"],
        output_dir=str(tree["output_dir"]),
        max_steps=max_steps,
        model=str(tree["model"]),
        data=[str(d) for d in data],
        env=env,
        rollout=rollout,
        trl=dict(tree.get("trl") or {}),
        skyrl=dict(tree.get("skyrl") or {}),
        sft=sft,
        curriculum=curriculum,
        chat_template=None if tree.get("chat_template") is None else str(tree["chat_template"]),
        source=str(path),
    )
