"""Chat templates by name: one TRL ships (``trl:NAME``) or a Jinja file.

A recipe's ``chat_template``, ``eval --chat-template`` and ``learn``'s setting all name a template
this way, for models whose own template cannot render what the run needs (tool calls, Qwen3's
training variant).
"""

from __future__ import annotations

from pathlib import Path

from deepanalyze_env.core.errors import ConfigError


def chat_template_text(ref: str, relative_to: Path | None = None, what: str = "chat_template") -> str:
    """The text of a chat template named by ``ref``: ``trl:NAME`` for one TRL ships
    (``trl/chat_templates/NAME.jinja``, e.g. ``trl:qwen3``), else a Jinja file (a relative path from
    ``relative_to`` when given). Raises ConfigError naming ``what`` and the choices."""
    if ref.startswith("trl:"):
        try:
            import trl
        except ImportError as exc:
            raise ConfigError(f"{what} {ref!r} needs TRL: pip install -e '.[trl]' ({exc})")
        path = Path(trl.__file__).parent / "chat_templates" / f"{ref[len('trl:') :]}.jinja"
        if not path.is_file():
            shipped = sorted(p.stem for p in path.parent.glob("*.jinja"))
            raise ConfigError(f"{what} {ref!r}: TRL ships no such template (it has {', '.join(shipped)})")
        return path.read_text(encoding="utf-8")
    path = Path(ref).expanduser()
    if not path.is_absolute() and relative_to is not None:
        path = relative_to / path
    if not path.is_file():
        raise ConfigError(f"{what}: no such file {path}")
    return path.read_text(encoding="utf-8")
