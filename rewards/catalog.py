"""What reward functions this environment has, described for people (``deepanalyze-rl rewards``).

One entry per function, whatever names it goes by (the built-in judges answer to their
upstream aliases too): the package it comes from, the context fields it reads, the arguments a
task may set, the components it produces and whether it needs a judge.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

from rewards import plugins
from rewards.registry import BUILTIN_PACKAGE, RewardFunction, registered


@dataclass(frozen=True)
class FunctionInfo:
    """One reward function as ``deepanalyze-rl rewards`` lists it."""

    name: str
    aliases: tuple[str, ...]
    package: str
    target: str  # module:qualname
    context: tuple[str, ...]  # the context fields it reads
    arguments: tuple[str, ...]  # its own arguments, "name: type = default"
    components: tuple[str, ...]  # a dict function that declares none: its name (its keys are unknown)
    needs_judge: bool
    optional: bool
    summary: str  # the first line of its docstring

    def as_dict(self) -> dict[str, str | bool | tuple[str, ...]]:
        """Its fields by name (``rewards --json``)."""
        return asdict(self)


def _info(fn: RewardFunction, names: list[str]) -> FunctionInfo:
    doc = inspect.getdoc(fn.fn) or ""
    return FunctionInfo(
        name=names[0],
        aliases=tuple(names[1:]),
        package=fn.package,
        target=fn.target,
        context=fn.params,
        arguments=tuple(p.describe() for p in fn.own),
        components=fn.component_names,
        needs_judge=fn.needs_judge,
        optional=fn.optional,
        summary=doc.splitlines()[0] if doc else "",
    )


def catalog() -> list[FunctionInfo]:
    """Every reward function known here (built-ins, this process's, installed plugins): built-ins
    first, then by package and name."""
    known = registered()
    groups: dict[tuple[int, tuple[str, ...]], list[str]] = {}
    for name, fn in known.items():  # a name, then its aliases (same components): registration order
        groups.setdefault((id(fn.fn), fn.component_names), []).append(name)
    infos = [_info(known[names[0]], names) for names in groups.values()]
    return sorted(infos, key=lambda i: (i.package != BUILTIN_PACKAGE, i.package, i.name))


def plugin_problems() -> list[str]:
    """Clashes and plugins that failed to load, one line each."""
    return plugins.problems()
