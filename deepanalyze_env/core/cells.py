"""How a turn's code becomes a cell: the task's workspace folder, the episode's kernel, one
cell run under the profile's rules, and the replay of a recovery row's prefix.

Shared by ``DeepAnalyzeEnv`` (every action format runs code through :func:`run_action`) and by
``deepanalyze-rl recover`` (which checks a row's prefix with :func:`replay_prefix` before
writing it), so a replayed turn meets exactly the rules it met when it was recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from deepanalyze_env.core.config import ConfigError, ConfigSource, EnvConfig
from deepanalyze_env.core.contracts import ExecInfo, ExecStatus, JsonObject, JsonValue
from deepanalyze_env.core.formats import Action, ActionFormat, get_format
from deepanalyze_env.core.prefix import PrefixTurn, first_mismatch
from deepanalyze_env.core.profiles import PROFILES, Profile
from tools.kernel import Kernel
from tools.workspace import UnsafeWorkspace, Workspace


def resolve_workspace(root: str | None, data: JsonValue, workspace_id: JsonValue) -> Path | None:
    """``workspace_root/data/workspace_id`` (upstream layout); None when the row has no data."""
    parts = [str(p) for p in (data, workspace_id) if p not in (None, "")]
    if not parts:
        return None
    if not root:
        raise ConfigError(
            f"the task names a workspace ({'/'.join(parts)}) but env_config.workspace_root is not set"
        )
    path = Path(root).expanduser().joinpath(*parts)
    if not path.is_dir():
        raise ConfigError(f"workspace folder does not exist: {path} (workspace_root/data/workspace_id)")
    return path


def start_kernel(config: EnvConfig, profile: Profile, workspace: Path) -> Kernel:
    """The episode's kernel worker, with the executor settings of ``config``."""
    ex = config.executor
    return Kernel(
        workspace,
        timeout_s=ex.timeout_s,
        memory_mb=ex.memory_mb,
        max_output_chars=ex.max_output_chars,
        stateful=config.stateful_cells,
        python=ex.python,
        preload=tuple(ex.preload) if ex.preload is not None else None,
        timeout_message=profile.timeout_message,
        crash_message=profile.crash_message,
        sandbox=getattr(ex, "sandbox", None),
    )


def run_action(
    kernel: Kernel | None, profile: Profile, action: Action, has_workspace: bool
) -> tuple[str, ExecInfo]:
    """Run an action's cell under the profile's rules: its output and ``ExecInfo``.

    The one place a turn becomes a cell, in every format, shared by ``step`` and the prefix
    replays (``init``, :func:`replay_prefix`) so a replayed turn meets exactly the rules it met
    when it was recorded. An action without code runs nothing: its output is the format's
    reason (``no_code``)."""
    code = action.code
    if code is None:
        return action.no_code, {"status": "no_code", "elapsed_ms": 0.0, "truncated": False}
    if not has_workspace and not profile.run_without_workspace:
        # upstream ran no code for a task without a workspace; the turn then counted 0
        return "", {"status": "skipped", "elapsed_ms": 0.0, "truncated": False}
    assert kernel is not None
    result = kernel.run(code)
    return result.output, {
        "status": cast(ExecStatus, result.status),
        "elapsed_ms": result.elapsed_ms,
        "truncated": result.truncated,
    }


def replay_turns(
    kernel: Kernel | None, profile: Profile, fmt: ActionFormat, turns: list[PrefixTurn], has_workspace: bool
) -> str | None:
    """Replay a prefix's turns, each read by the format as ``step`` reads it: the first mismatch
    with its recorded observation, or None (``prefix.first_mismatch``)."""
    return first_mismatch(
        turns, lambda text: run_action(kernel, profile, fmt.read(text, profile), has_workspace)[0]
    )


def replay_prefix(env_config: ConfigSource, row: JsonObject) -> str | None:
    """Replay a row's ``prefix`` in a fresh workspace and kernel, as ``init`` does, without
    building its reward plan (so no judge is needed): the first mismatch, or None when every
    cell gives its recorded output. ``deepanalyze-rl recover`` checks each row with this before
    writing it. Raises ``ConfigError`` for a bad row, ``KernelError`` when no kernel starts."""
    config = EnvConfig.from_any(env_config)  # validated: its profile is a known one
    profile, fmt = PROFILES[config.profile], get_format(config.action_format)
    turns = fmt.parse_prefix(row.get("prefix"), profile)
    source = resolve_workspace(config.workspace_root, row.get("data"), row.get("workspace_id"))
    try:
        workspace = Workspace(source, config.executor.disk_mb)
    except UnsafeWorkspace as exc:
        raise ConfigError(str(exc)) from exc
    kernel = None
    try:
        kernel = start_kernel(config, profile, workspace.path)
        return replay_turns(kernel, profile, fmt, turns, source is not None)
    finally:
        if kernel is not None:
            kernel.close()
        workspace.remove()
