"""The distribution's two other top-level packages, ``rewards`` and ``tools``, and the check that
the ones Python finds are ours.

They keep their top-level names (docs/design.md §2, "Import names"): users' reward plugins
import ``rewards.registry``, and the kernel side (``tools``) is loaded in the executor's own
interpreter, where ``deepanalyze_env`` need not be installed. The price is that another
distribution's top-level ``tools`` or ``rewards`` earlier on ``sys.path`` would shadow ours and
surface later as a puzzling ``ImportError`` deep in a run; this check turns that into one line
at import, naming both folders.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOP_LEVEL = ("rewards", "tools")


class ShadowedPackageError(ImportError):
    """Another installed package provides ``rewards`` or ``tools`` ahead of this distribution's."""


def check_top_level(root: Path | None = None) -> None:
    """Raise ``ShadowedPackageError`` unless each of ``TOP_LEVEL`` resolves to ``root/<name>``.

    ``root`` is the folder holding ``deepanalyze_env`` (site-packages, or the checkout in an
    editable install); ``find_spec`` reads no module, so this costs a path lookup per name.
    """
    root = (root or Path(__file__).resolve().parent.parent).resolve()
    for name in TOP_LEVEL:
        spec = importlib.util.find_spec(name)
        expected = root / name
        found = [Path(p).resolve() for p in (spec.submodule_search_locations or [])] if spec else []
        if expected.resolve() not in found:
            where = ", ".join(str(p) for p in found) or (spec.origin if spec else "nowhere")
            raise ShadowedPackageError(
                f"deepanalyze-env's top-level package {name!r} should come from {expected}, but Python "
                f"finds it at {where}: another installed package uses the name {name!r}; uninstall it "
                "or put deepanalyze-env first on sys.path"
            )
