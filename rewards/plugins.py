"""Reward functions from installed packages: the ``deepanalyze_env.rewards`` entry points.

A registry filled by ``@register_reward`` is per process: a name registered in a notebook is
unknown to ``deepanalyze-rl rollout``, to a server, and to the Ray task in which SkyRL builds
the env. Entry points are Python's answer for plugins every process can find: a package
declares, in its ``pyproject.toml``::

    [project.entry-points."deepanalyze_env.rewards"]
    answer_len_ok = "mypackage.rewards:answer_len_ok"   # one function under that name
    mypackage = "mypackage.rewards"                      # or a module that registers several

and once it is installed (``pip install -e .``) the bare name resolves in any process. Loading
happens once per process, on the first name lookup, and loads every declared plugin, so what a
name means never depends on which other names a task happens to use. A name declared by two
packages, or by a package and the built-ins, is a one-line error naming both — for that name
only; a plugin that fails to import is reported by the names it declares (or, for a module
entry, in the "unknown reward function" message) and does not stop other names from working.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass, field

from rewards import registry

log = logging.getLogger(__name__)

GROUP = "deepanalyze_env.rewards"


@dataclass(frozen=True)
class Declared:
    """One entry point of the group: the reward name, what it points at, and the package declaring it."""

    name: str
    value: str  # "module:function" or "module"
    package: str
    version: str

    @property
    def is_module(self) -> bool:
        return ":" not in self.value

    @property
    def where(self) -> str:
        return f"{self.package} {self.version} ({self.name} = {self.value!r})"


@dataclass
class _State:
    loaded: bool = False
    loading: bool = False
    declared: tuple[Declared, ...] = ()
    problems: dict[str, str] = field(default_factory=dict)  # reward name -> why it cannot be used
    failures: list[str] = field(default_factory=list)  # module entries that failed to import


_state = _State()
_lock = threading.RLock()


def discover() -> tuple[Declared, ...]:
    """The group's entry points of every installed distribution (one metadata scan)."""
    from importlib import metadata

    found: dict[tuple[str, str, str], Declared] = {}
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        package = (dist.metadata["Name"] if dist is not None else None) or "an unknown package"
        version = (dist.version if dist is not None else None) or "?"
        found.setdefault((ep.name, ep.value, package), Declared(ep.name, ep.value, package, version))
    return tuple(sorted(found.values(), key=lambda d: (d.package, d.name)))


def ensure_loaded() -> None:
    """Load every declared plugin once per process (thread-safe; a no-op afterwards)."""
    if _state.loaded:
        return
    with _lock:
        if _state.loaded or _state.loading:  # done, or a plugin being imported looked a name up
            return
        _state.loading = True
        try:
            _load(_state)
        finally:
            _state.loading = False
            _state.loaded = True


def _load(state: _State) -> None:
    state.declared = discover()
    by_name: dict[str, list[Declared]] = {}
    for entry in state.declared:
        if not entry.is_module:
            by_name.setdefault(entry.name, []).append(entry)
    for name, entries in by_name.items():
        packages = sorted({e.package for e in entries})
        if len(packages) > 1:
            first, second = (next(e for e in entries if e.package == p) for p in packages[:2])
            state.problems[name] = (
                f"reward name {name!r} is declared by two packages: {first.where} and {second.where}; "
                "uninstall or rename one"
            )
    for entry in state.declared:
        if entry.is_module or entry.name not in state.problems:
            _load_one(entry, state)
    for line in [*state.failures, *state.problems.values()]:
        log.warning("reward plugins: %s", line)


def _load_one(entry: Declared, state: _State) -> None:
    registry.set_loading_origin(entry.package)
    try:
        if entry.is_module:
            importlib.import_module(entry.value)
            return
        module_name, _, attr = entry.value.partition(":")
        obj: object = importlib.import_module(module_name.strip())
        for part in attr.strip().split("."):
            obj = getattr(obj, part)
        if not callable(obj):
            state.problems[entry.name] = f"plugin {entry.where} does not point at a function"
            return
        registry.add(registry.describe_as(obj, entry.name, entry.package))
    except registry.RewardNameClash as exc:
        state.problems[exc.name] = str(exc)
        if entry.is_module:
            state.failures.append(f"{entry.where} stopped loading: {exc}")
    except Exception as exc:  # a broken plugin must not take the other names down
        why = f"plugin {entry.where} failed to load: {type(exc).__name__}: {exc}"
        if entry.is_module:
            state.failures.append(why)
        else:
            state.problems[entry.name] = why
    finally:
        registry.set_loading_origin(None)


def problem_for(name: str) -> str | None:
    """Why ``name`` cannot be used (a clash, or its plugin failed to load), or None."""
    return _state.problems.get(name)


def failures_note() -> str:
    """A clause for "unknown reward function" errors: module plugins that failed to import."""
    return "".join(f"; {line}" for line in _state.failures)


def problems() -> list[str]:
    """Every plugin problem of this process, one line each (for ``deepanalyze-rl rewards``)."""
    ensure_loaded()
    return [*_state.failures, *(_state.problems[name] for name in sorted(_state.problems))]


def declared() -> tuple[Declared, ...]:
    ensure_loaded()
    return _state.declared
