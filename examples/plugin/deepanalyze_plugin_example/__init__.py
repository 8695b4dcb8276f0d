"""An example deepanalyze-env reward plugin: ``answer_len_ok`` and a revised analysis rubric."""

from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
"""A ``judge.prompt_dir`` / ``judge-eval --prompt-dir`` folder (it holds ``judge_analysis.md``)."""
