"""Reward-function registry (docs/design.md §7).

A reward function is a plain function whose parameters are either context fields (named after
:class:`rewards.context.RewardContext`'s fields; the env passes those) or arguments of its own,
which a task sets in ``reward_spec["function"]`` as ``{"name": …, "args": {…}}`` and which are
checked against the signature when a plan is built (:func:`check_args`), never at episode time.

Names come from three places, looked up in this order: functions registered in this process
(the built-ins, ``@register_reward``), the ``deepanalyze_env.rewards`` entry points of installed
packages (:mod:`rewards.plugins`, loaded on the first lookup in each process, so a bare name
works in every process — CLI commands, servers, Ray workers — without importing anything), and a
``package.module:attr`` path. A name two packages claim is an error naming both.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import threading
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from deepanalyze_env.core.contracts import JsonValue
from rewards.context import CONTEXT_FIELDS

__all__ = [
    "CONTEXT_FIELDS",
    "Noted",
    "Param",
    "RewardFunction",
    "RewardSpecError",
    "check_args",
    "package_of",
    "register_reward",
    "registered",
    "registered_names",
    "resolve",
    "with_notes",
]

BUILTIN_PACKAGE = "deepanalyze-env"
_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class Noted:
    """A reward function's value with why it is what it is, in a sentence (``file_match``: "out.csv
    is a symbolic link..."): the plan scores ``value`` and the env puts ``note`` under the final
    step's ``metadata["reward_notes"][component label]``, so a 0 that is the policy's failure says so."""

    value: Any  # what the reward function returned (the plan checks it)
    note: str


def with_notes(value: Any, *notes: str | None) -> Any:  # a reward function's own value, as is
    """``value`` carrying the notes that are set (joined by "; ") as a :class:`Noted`, or bare when
    none is: the one way a reward function attaches its reasons."""
    kept = [note for note in notes if note]
    return Noted(value, "; ".join(kept)) if kept else value


class RewardSpecError(ValueError):
    """A reward_spec / reward function problem found while building a plan."""


class RewardNameClash(RewardSpecError):
    """Two packages (or a package and the built-ins) register one reward name."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


@dataclass(frozen=True)
class Param:
    """One of a reward function's own parameters (not a context field): a task sets it through
    ``args``; one without a default must be set."""

    name: str
    annotation: object  # a type or typing form; inspect.Parameter.empty when unannotated; a string
    # when it could not be resolved
    default: object  # inspect.Parameter.empty when required

    @property
    def required(self) -> bool:
        return self.default is _EMPTY

    def describe(self) -> str:
        text = self.name
        if self.annotation is not _EMPTY:
            text += f": {type_name(self.annotation)}"
        if not self.required:
            text += f" = {self.default!r}"
        return text


@dataclass(frozen=True)
class RewardFunction:
    """A registered reward function with what the plan needs to call it: the context fields it asks for,
    its own arguments, its component names, whether it needs the judge or is async, and who provides it."""

    name: str
    fn: Callable
    params: tuple[str, ...]  # the context fields it names
    components: tuple[str, ...] | None  # declared keys of a dict-returning function
    needs_judge: bool
    is_async: bool
    optional: bool = False
    own: tuple[Param, ...] = ()  # its own arguments, set per task by reward_spec args
    origin: str | None = None  # the package that registered it; None: found from its module on demand
    needs_prefix: bool = False  # only a row with a prefix (a recovery task) can be scored by it

    @property
    def component_names(self) -> tuple[str, ...]:
        return self.components if self.components is not None else (self.name,)

    @property
    def package(self) -> str:
        return self.origin or package_of(self.fn)

    @property
    def target(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}:{getattr(self.fn, '__qualname__', '?')}"


_REGISTRY: dict[str, RewardFunction] = {}
_local = threading.local()  # .origin: the package whose plugin module is being imported


def loading_origin() -> str | None:
    return getattr(_local, "origin", None)


def set_loading_origin(package: str | None) -> None:
    _local.origin = package


def package_of(fn: Callable) -> str:
    """The installed distribution a function's module belongs to (``deepanalyze-env`` for the
    built-ins), or ``module M (no installed package)``."""
    module = str(getattr(fn, "__module__", "") or "")
    top = module.split(".", 1)[0]
    if top in ("rewards", "deepanalyze_env"):
        return BUILTIN_PACKAGE
    dists = _distributions().get(top) or []
    return dists[0] if dists else f"module {module or '?'} (no installed package)"


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    """Top-level module → distributions (a scan of every installed package: once per process)."""
    from importlib import metadata

    return metadata.packages_distributions()


def _signature(fn: Callable) -> inspect.Signature:
    """The signature with string annotations resolved where they can be (``from __future__ import
    annotations`` makes every annotation a string); unresolvable ones stay strings, checked as Any."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:
        return inspect.signature(fn)


def _describe(
    fn: Callable,
    name: str,
    components: Sequence[str] | None,
    needs_judge: bool,
    optional: bool,
    origin: str | None = None,
    needs_prefix: bool = False,
) -> RewardFunction:
    if not callable(fn):
        raise RewardSpecError(f"reward function {name!r} is not callable ({fn!r})")
    params: list[str] = []
    own: list[Param] = []
    for param in _signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise RewardSpecError(
                f"reward function {name!r} must name its context fields and arguments; "
                "*args/**kwargs not allowed"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise RewardSpecError(f"reward function {name!r}: parameter {param.name!r} is positional-only")
        if param.name in CONTEXT_FIELDS:
            params.append(param.name)
        else:
            own.append(Param(param.name, param.annotation, param.default))
    return RewardFunction(
        name=name,
        fn=fn,
        params=tuple(params),
        components=tuple(components) if components is not None else None,
        needs_judge=needs_judge or "judge" in params,
        is_async=inspect.iscoroutinefunction(fn),
        optional=optional,
        own=tuple(own),
        origin=origin,
        needs_prefix=needs_prefix,
    )


def register_reward(
    name: str,
    *,
    components: Sequence[str] | None = None,
    needs_judge: bool = False,
    aliases: Sequence[str] = (),
    optional: bool = False,
    needs_prefix: bool = False,
    replace: bool = False,
) -> Callable[[Callable], Callable]:
    """Register ``fn`` under ``name`` (and ``aliases``) in this process.

    A dict-returning function declares its ``components`` so duplicate component names are
    caught at plan construction; a float-returning one may declare a single component name
    that differs from its registered name. ``optional`` functions may return None, meaning
    "does not apply to this episode" (the component is then absent); for any other function
    None is a failure to compute, never a silent 0. A ``needs_prefix`` function scores what a
    policy does after a recovery row's prefix: a plan holding it refuses a row without one at env
    construction. Re-registering the same function is a no-op (modules get
    imported twice under different runners); a different function under a taken name is an
    error naming both packages unless ``replace=True`` (refused for a name another package owns
    while plugins load). To make a name known in every process, declare an entry point instead
    (:mod:`rewards.plugins`).
    """

    def decorator(fn: Callable) -> Callable:
        origin = loading_origin()
        for key in (name, *aliases):
            existing = _REGISTRY.get(key)
            taken = existing is not None and not _same_function(existing.fn, fn)
            if taken and (not replace or origin is not None):
                raise clash(key, existing, origin or package_of(fn), fn)
            _REGISTRY[key] = _describe(fn, key, components, needs_judge, optional, origin, needs_prefix)
        return fn

    return decorator


def clash(name: str, existing: RewardFunction, package: str, fn: Callable[..., object]) -> RewardNameClash:
    """The one-line error for a reward name two providers claim."""
    target = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
    return RewardNameClash(
        f"reward name {name!r} is already registered by {existing.package} ({existing.target}); "
        f"{package} registers another function under it ({target}): rename one",
        name,
    )


def add(described: RewardFunction) -> None:
    """Register an already described function (what the plugin loader does for entry points)."""
    existing = _REGISTRY.get(described.name)
    if existing is not None and not _same_function(existing.fn, described.fn):
        raise clash(described.name, existing, described.package, described.fn)
    if existing is None:
        _REGISTRY[described.name] = described


def describe_as(fn: Callable, name: str, origin: str) -> RewardFunction:
    """``fn`` under ``name``: keeping the options it was registered with under another name
    (components, judge, optional), else described plainly."""
    for known in _REGISTRY.values():
        if known.fn is fn:
            return replace(known, name=name, origin=origin)
    return _describe(fn, name, None, False, False, origin)


def _same_function(a: Callable, b: Callable) -> bool:
    """The same function object, or the same definition imported twice (e.g. by a runner)."""
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def registered() -> dict[str, RewardFunction]:
    """Every name known in this process, built-ins and loaded plugins (a copy)."""
    from rewards import plugins

    plugins.ensure_loaded()
    return dict(_REGISTRY)


def registered_names() -> list[str]:
    return sorted(registered())


def resolve(ref: str) -> RewardFunction:
    """A registered name (built-in, this process's, or an installed plugin's), or a
    ``package.module:attr`` path (imported on demand)."""
    from rewards import plugins

    if not isinstance(ref, str) or not ref:
        raise RewardSpecError(f"reward function reference must be a non-empty string, got {ref!r}")
    plugins.ensure_loaded()
    problem = plugins.problem_for(ref)
    if problem is not None:
        raise RewardSpecError(problem)
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    if ":" in ref:
        return _resolve_path(ref)
    hint = difflib.get_close_matches(ref, list(_REGISTRY), n=1)
    raise RewardSpecError(
        f"unknown reward function {ref!r}"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f"; registered: {', '.join(sorted(_REGISTRY))}"
        + plugins.failures_note()
        + f"; add one as an entry point in the group {plugins.GROUP!r} of an installed package, "
        + "or give a 'package.module:attr' path"
    )


def _resolve_path(ref: str) -> RewardFunction:
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardSpecError(f"cannot import reward module {module_name!r} for {ref!r}: {exc}")
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise RewardSpecError(f"{ref!r}: module {module_name!r} has no callable {attr!r}")
    if ref in _REGISTRY:  # the import registered it under its path
        return _REGISTRY[ref]
    for described in _REGISTRY.values():
        if described.fn is fn:
            return described
    return _describe(fn, attr, None, False, False)


# ---------------------------------------------------------------------------- arguments


def type_name(annotation: object) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def fits(value: JsonValue, annotation: object) -> bool:
    """Whether a JSON-shaped ``value`` fits ``annotation`` (unknown or unresolved annotations
    accept anything: the check is for mistakes, not a type system). A float parameter takes an
    integer; an int parameter does not take a bool."""
    if annotation is _EMPTY or annotation is Any or isinstance(annotation, str | typing.TypeVar):
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is tuple or annotation is tuple:
        if not isinstance(value, list | tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(fits(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(map(fits, value, args)))
    if origin in (list, set, frozenset, Sequence) or annotation in (list, set, frozenset, Sequence):
        return isinstance(value, list | tuple) and all(fits(v, args[0] if args else _EMPTY) for v in value)
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        if not isinstance(value, dict):
            return False
        if len(args) == 2:
            return all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
        return True
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def check_args(
    fn: RewardFunction, args: JsonValue | Mapping[str, JsonValue], where: str
) -> dict[str, JsonValue]:
    """``args`` for ``fn`` checked against its signature: every key one of its own arguments,
    every argument without a default given, every value of its annotated type. Raises a
    one-line :class:`RewardSpecError` starting with ``where``."""
    if args is None:
        args = {}
    if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
        raise RewardSpecError(f"{where}: args must be an object of argument names, got {args!r}")
    own = {p.name: p for p in fn.own}
    takes = ", ".join(p.describe() for p in fn.own) or "none"
    for key in args:
        if key in own:
            continue
        if key in CONTEXT_FIELDS and key in fn.params:
            raise RewardSpecError(
                f"{where}: {key!r} is a context field the env passes; it cannot be set in args"
            )
        raise RewardSpecError(f"{where}: unknown argument {key!r} ({fn.name} takes: {takes})")
    for param in fn.own:
        if param.required and param.name not in args:
            close = difflib.get_close_matches(param.name, sorted(CONTEXT_FIELDS), n=1)
            hint = f"; or did you mean the context field {close[0]!r}?" if close else ""
            raise RewardSpecError(
                f"{where}: missing argument {param.name!r} ({fn.name} takes: {takes}){hint}"
            )
        if param.name in args and not fits(args[param.name], param.annotation):
            raise RewardSpecError(
                f"{where}: argument {param.name!r} must be {type_name(param.annotation)}, "
                f"got {args[param.name]!r}"
            )
    return dict(args)
