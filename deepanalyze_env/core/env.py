"""``DeepAnalyzeEnv``: one data-analysis episode as a skyrl_gym ``BaseTextEnv``.

Construction validates everything a config or dataset row can get wrong (so a bad run fails
before the first rollout); ``step()`` never raises for anything the policy writes: bad actions
become observations and statuses, infrastructure faults become ``environment_error``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, cast

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from deepanalyze_env.core.cells import replay_turns, resolve_workspace, run_action, start_kernel
from deepanalyze_env.core.config import ConfigError, ConfigSource, EnvConfig, JudgeConfig
from deepanalyze_env.core.contracts import (
    EXEC_STATUSES,
    REWARD_STATUSES,
    TERMINATIONS,
    ChatMessage,
    EpisodeResult,
    ExecInfo,
    FinalMetadata,
    Gate,
    JsonObject,
    RewardStatus,
    Termination,
    TurnMetadata,
    verifier_error_rates,
)
from deepanalyze_env.core.formats import Action, get_format
from deepanalyze_env.core.hacking import Watched, suspect_reasons
from deepanalyze_env.core.prefix import PrefixTurn, prefix_messages
from deepanalyze_env.core.profiles import PROFILES, Profile
from deepanalyze_env.core.records import RecordWriter, build_record, judge_versions, package_version
from deepanalyze_env.core.tool_calls import ParsedTurn
from rewards import Plan, RewardContext, RewardOutcome, RewardSpecError
from tools.kernel import Kernel, KernelError
from tools.workspace import UnsafeWorkspace, Workspace

if TYPE_CHECKING:
    from rewards.judge import JudgeClient, JudgeSession

log = logging.getLogger(__name__)


def load_system_prompt(setting: str | None, action_format: str = "tags") -> str | None:
    """The system prompt ``env_config.system_prompt`` names: ``protocol`` is the shipped prompt of
    the action format (the tag protocol, or how to use the two tools), else a file."""
    if setting is None:
        return None
    if setting == "protocol":
        return (
            resources.files("deepanalyze_env.core")
            .joinpath(get_format(action_format).prompt_file)
            .read_text(encoding="utf-8")
        )
    path = Path(setting).expanduser()
    if not path.is_file():
        raise ConfigError(f"env_config.system_prompt: no such file {setting!r} (or use 'protocol')")
    return path.read_text(encoding="utf-8")


def _judge_client(config: JudgeConfig, functions: list[str]) -> JudgeClient:
    """The process's shared judge client; a bad judge setting or prompt file fails here."""
    from rewards.judge import JudgeError, get_judge_client, validate_prompts
    from rewards.judges import rubrics_for

    try:
        client = get_judge_client(config)
        validate_prompts(client.settings.prompt_dir, rubrics_for(functions))
    except (JudgeError, ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from exc
    return client


def keeps_sampled_tokens(text: str, cut: str) -> bool:
    """Whether a trainer should keep the sampled tokens of a turn the env cut to ``cut``.

    None as ``postprocessed_action`` tells SkyRL's generator to keep them; a string makes it
    re-tokenize that string, so the trained ids stop being the sampled ones while the sampled
    logprobs are kept. Keep them when nothing was cut, and when all that follows the closing
    tag is whitespace: that is the rest of the token that completed the tag (Qwen- and
    Llama-3-style tokenizers merge ``>`` with a newline, and vLLM stops at the stop string but
    returns every sampled id). The env still executes and records the text cut at the tag.
    """
    return not text[len(cut) :].strip()


class DeepAnalyzeEnv(BaseTextEnv):
    """One data-analysis episode (skyrl_gym env id ``deepanalyze``).

    Lifecycle: construct (validates ``env_config`` and the row's ``extras``; a bad reward spec,
    a missing judge or workspace fails here) → ``init(prompt)`` (scratch copy of the task's
    files, a kernel worker) → ``step(action)`` until ``done`` → ``close()`` (worker killed,
    scratch removed, record appended when ``records_dir`` is set). ``result()`` returns the
    episode as one value; ``get_metrics()`` gives numbers for trainer logs.

    Example::

        env = DeepAnalyzeEnv({"workspace_root": "data"}, extras=row_without_prompt)
        messages, _ = env.init(row["prompt"])
        out = env.step("<Analyze>…</Analyze><Code>```python\nprint(1)\n```</Code>")
        env.close()
    """

    def __init__(self, env_config: ConfigSource = None, extras: JsonObject | None = None):
        super().__init__()
        self.config = EnvConfig.from_any(env_config)  # validated: profile and format are known names
        self.profile = PROFILES[self.config.profile]
        self.format = get_format(self.config.action_format)
        self.extras: JsonObject = dict(extras or {})
        self.plan: Plan | None = None
        self.reward_spec: JsonObject = {}
        self.judge_client: JudgeClient | None = None
        self.question = self.extras.get("input_seq")
        self.max_turns = self.config.max_turns
        self.source_workspace: Path | None = None
        self.prefix: list[PrefixTurn] = []
        self.prefix_error: str | None = None  # the replay's mismatch, when there was one
        self._infra_error: str | None = None
        try:
            self._load_row()
        except ConfigError as exc:
            if self.config.row_errors == "raise":
                raise
            # row_errors: episode — a trainer's batch must not die for one bad row (the startup
            # row check catches what it can; this is what only shows up at episode time)
            log.error("bad dataset row (task %s): %s", self.extras.get("task_id"), exc)
            self._infra_error = f"bad dataset row: {exc}"
        self.system_prompt = load_system_prompt(self.config.system_prompt, self.config.action_format)
        self.submitted: str | None = None  # an answer given outside the text (submit_answer)
        self.action_errors: list[str] = []  # why each invalid action was invalid (fails the gate)
        self.task_id = self.extras.get("task_id") or self.extras.get("id")

        self.messages: list[ChatMessage] = []
        self.prompt_len = 0
        self.policy_turns: list[str] = []
        self.code_pass: list[int] = []
        self.exec_log: list[ExecInfo] = []
        self.kernel: Kernel | None = None
        self.workspace: Workspace | None = None
        self.kernel_versions: dict[str, str] = {}
        self.final_metadata: FinalMetadata | None = None
        self.final_reward: float | None = None
        self.timings: dict[str, float] = {}
        self._closed = False
        self.unfinished_reason: str | None = None  # close(unfinished=…): why it ended early
        self.judge_session: JudgeSession | None = None

    def _load_row(self) -> None:
        """Everything that depends on the dataset row (``extras``): the reward plan, the judge it
        needs, the question, the turn limit and the workspace. Raises ConfigError naming the
        problem; ``deepanalyze_env.core.row_check`` runs this for every row before training."""
        spec = self.extras.get("reward_spec")
        if isinstance(spec, str):  # parquet files may carry it as JSON text (prepare-data does)
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"extras.reward_spec is a string but not JSON: {exc.msg}")
            self.extras["reward_spec"] = spec
        if spec is None:
            raise ConfigError("extras.reward_spec is missing: every dataset row needs a reward_spec column")
        try:
            plan = self.profile.build_plan(spec)
        except RewardSpecError as exc:
            task = self.extras.get("task_id") or self.extras.get("id")
            raise ConfigError(f"task {task!r}: {exc}" if task is not None else str(exc)) from exc
        self.plan = plan
        self.reward_spec = dict(spec)
        needs_judge = plan.needs_judge
        if needs_judge:
            if not self.config.judge.configured:
                raise ConfigError(
                    f"reward plan needs a judge for {', '.join(needs_judge)} "
                    "but env_config.judge is not set (set judge.backend: openai with "
                    "judge.base_url and judge.model, or transformers / replay)"
                )
            self.judge_client = _judge_client(self.config.judge, needs_judge)
        if needs_judge and not self.question:
            raise ConfigError(f"extras.input_seq is missing; {', '.join(needs_judge)} shows it to the judge")
        self.max_turns = int(self.extras.get("max_turns") or self.config.max_turns)
        if self.max_turns < 1:
            raise ConfigError("extras.max_turns must be >= 1")
        self.source_workspace = resolve_workspace(
            self.config.workspace_root, self.extras.get("data"), self.extras.get("workspace_id")
        )
        if self.extras.get("prefix") is not None:
            self.prefix = self.format.parse_prefix(self.extras["prefix"], self.profile)
        if plan.needs_prefix and not self.prefix:
            raise ConfigError(
                f"reward component {', '.join(map(repr, plan.needs_prefix))} needs a row with a prefix "
                "(a recovery task written by deepanalyze-rl recover); this row has none"
            )

    # ------------------------------------------------------------------ lifecycle

    def init(self, prompt: str | Sequence[ChatMessage]) -> tuple[list[ChatMessage], dict[str, object]]:
        """Start the episode: returns the prompt messages (with the protocol system prompt when
        configured, then the row's ``prefix`` turns). A workspace or kernel that cannot be set up,
        or a prefix whose replay differs from its record, ends the episode at its first step as
        ``environment_error`` instead of raising."""
        messages: list[ChatMessage] = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else [cast(ChatMessage, dict(m)) for m in prompt]
        )
        if self.system_prompt:
            if messages and messages[0].get("role") == "system":
                messages[0]["content"] = self.system_prompt + "\n\n" + messages[0]["content"]
            else:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
        messages += prefix_messages(self.prefix)
        self.messages = list(messages)
        self.prompt_len = len(messages)
        start = time.monotonic()
        if self._infra_error is not None:  # a bad row (row_errors: episode): nothing to start
            return messages, {}
        try:
            try:
                self.workspace = Workspace(self.source_workspace, self.config.executor.disk_mb)
            except UnsafeWorkspace as exc:  # the task's data is wrong: loud, like a missing folder
                raise ConfigError(str(exc)) from exc
            self.kernel = start_kernel(self.config, self.profile, self.workspace.path)
            self.kernel_versions = self.kernel.versions
        except (KernelError, OSError) as exc:
            log.error("episode start failed: %s", exc)
            self._infra_error = f"episode start failed: {exc}"
        if self.prefix and self._infra_error is None:
            self._replay_prefix()
        self.timings["init_ms"] = (time.monotonic() - start) * 1000.0
        return messages, {}

    def _replay_prefix(self) -> None:
        """Rebuild the prefix's state: run its cells in this kernel and compare each output with
        the recorded observation. A difference (or a kernel fault) ends the episode at its first
        step as ``environment_error``: the policy would continue from a state that is not the one
        it is shown."""
        start = time.monotonic()
        try:
            self.prefix_error = replay_turns(
                self.kernel, self.profile, self.format, self.prefix, self.source_workspace is not None
            )
        except KernelError as exc:
            self.prefix_error = f"prefix replay failed: {exc}"
        if self.prefix_error is not None:
            log.error("task %s: %s", self.task_id, self.prefix_error)
            self._infra_error = f"{self.prefix_error} (the row is not reproducible)"
        self.timings["replay_ms"] = (time.monotonic() - start) * 1000.0

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One policy turn (docs/design.md section 6), read by the action format. Never raises
        for anything the policy wrote."""
        if self.final_metadata is not None:
            return self._final_step()
        self.turns += 1
        text = action if isinstance(action, str) else str(action)
        read = self._read(self.format.read, text)
        out = self._play(read)
        if keeps_sampled_tokens(text, read.text):
            out["postprocessed_action"] = None
        return out

    def act(self, turn: ParsedTurn, raw: str | None = None) -> BaseTextEnvStepOutput:
        """One policy turn whose call is already parsed, for a format that acts through calls (a
        trainer that parses calls itself, such as TRL's ``environment_factory``, calls this).
        ``raw`` is the turn's text as the policy wrote it (default: the free text and the call
        rendered as hermes text). Never raises for anything the policy wrote."""
        read = self.format.from_call(turn, raw)  # a ConfigError for a format without calls
        if self.final_metadata is not None:
            return self._final_step()
        self.turns += 1
        return self._play(read)

    def end_with_eos(self, action: str) -> BaseTextEnvStepOutput:
        """The policy ended its message with EOS and no stop string: record the turn and end the
        episode by the format's rule (``termination: "eos"``; ``answer``/``error`` when those
        apply). EOS hands the turn back; treating it as a code turn would put an observation
        after an end-of-message token.
        """
        if self.final_metadata is not None:
            return self._final_step()
        self.turns += 1
        text = action if isinstance(action, str) else str(action)
        return self._play(self._read(self.format.read_at_eos, text))

    def end_for_length(self) -> BaseTextEnvStepOutput:
        """End the episode because a trainer's token budget ran out (``termination: "length"``).

        The episode is scored as it stands (without an answer the format gate fails), so a
        trainer can either mask it (the default) or train on the failed gate.
        """
        if self.final_metadata is not None:
            return self._final_step()
        return self._finish("length", "")

    def _final_step(self) -> BaseTextEnvStepOutput:
        """A step after the end repeats the final result."""
        return BaseTextEnvStepOutput(
            observations=[],
            reward=self.final_reward,
            done=True,
            metadata=dict(cast(FinalMetadata, self.final_metadata).copy()),
            postprocessed_action="",
        )

    def _read(self, reader: Callable[[str, Profile], Action], text: str) -> Action:
        """``reader(text)``, the format's reading of a policy turn. The readers are total over text,
        but should one still raise, the turn is the policy's unreadable action (recorded as
        written, the episode ended, the format gate failed and scored), never an exception
        into the trainer nor an exclusion the policy's text chose."""
        try:
            return reader(text, self.profile)
        except Exception as exc:
            log.exception("a policy turn could not be read")
            error = f"unreadable turn ({type(exc).__name__})"
            return Action(text, {"role": "assistant", "content": text}, end="eos", error=error)

    def _play(self, action: Action) -> BaseTextEnvStepOutput:
        """Record a policy turn, then end the episode or run its cell, whatever the format."""
        self.policy_turns.append(action.text)
        self.messages.append(action.message)
        return self._guarded(action.text, lambda: self._advance(action))

    def _guarded(self, cut: str, turn: Callable[[], BaseTextEnvStepOutput]) -> BaseTextEnvStepOutput:
        """``turn()``, with a fault ending the episode as ``environment_error`` instead of raising:
        a lost kernel is infrastructure, and a bug of ours must not take the trainer down."""
        try:
            return turn()
        except KernelError as exc:
            return self._finish("error", cut, infra_error=str(exc))
        except Exception as exc:
            log.exception("internal error in a policy turn")
            return self._finish("error", cut, infra_error=f"internal error: {type(exc).__name__}: {exc}")

    def _advance(self, action: Action) -> BaseTextEnvStepOutput:
        if self._infra_error:
            return self._finish("error", action.text, infra_error=self._infra_error)
        if action.error is not None:
            self.action_errors.append(f"turn {self.turns}: {action.error}")
        if action.submitted is not None:
            self.submitted = action.submitted
        if action.end is not None:
            return self._finish(action.end, action.text)
        if self.turns >= self.max_turns:
            return self._finish("max_turns", action.text)
        return self._cell_turn(action)

    def _cell_turn(self, action: Action) -> BaseTextEnvStepOutput:
        """A turn that goes on: its cell run (or, with no code, the format's reason), its pass by
        the profile's rule, its exec entry and the observation recorded; the step output handed back."""
        output, exec_meta = run_action(self.kernel, self.profile, action, self.source_workspace is not None)
        observation = self.format.observation(output, self.config)
        passed = self.profile.code_pass(exec_meta["status"], output)
        self.code_pass.append(passed)
        self.exec_log.append(exec_meta)
        self.messages.append(observation)
        turn: TurnMetadata = {"code_pass": passed, "exec": exec_meta}
        return BaseTextEnvStepOutput(
            observations=[observation],
            reward=0.0,
            done=False,
            metadata=dict(turn),
            postprocessed_action=action.text,
        )

    def _context(self) -> RewardContext:
        # prompt_len covers the prefix: everything scored is what the policy did after it
        return RewardContext.for_episode(
            messages=self.messages,
            episode_start=self.prompt_len,
            policy_turns=self.policy_turns,
            reward_spec=self.reward_spec,
            question=self.question,
            code_pass=self.code_pass,
            exec_statuses=[e["status"] for e in self.exec_log],
            workspace=self.workspace.path if self.workspace else None,
            judge=self._judge_session(),
            prefix_turns=len(self.prefix),
            action_format=self.config.action_format,
            submitted=self.submitted,
            tool_errors=self.action_errors,
        )

    def _judge_session(self) -> JudgeSession | None:
        if self.judge_client is None:
            return None
        if self.judge_session is None:
            from rewards.judge import JudgeSession

            self.judge_session = JudgeSession(self.judge_client, score_rule=self.profile.score_rule)
        return self.judge_session

    def _finish(
        self, termination: Termination, cut: str, infra_error: str | None = None
    ) -> BaseTextEnvStepOutput:
        start = time.monotonic()
        if infra_error is not None:
            outcome = RewardOutcome(0.0, {}, "environment_error", False, None, infra_error)
        else:
            try:
                outcome = self.plan.score(self._context())
            except Exception as exc:
                log.exception("reward computation failed")
                error = f"{type(exc).__name__}: {exc}"
                outcome = RewardOutcome(0.0, {}, "verifier_error", True, None, error, cause="reward_raised")
        self.timings["reward_ms"] = (time.monotonic() - start) * 1000.0
        # a plan that names no cause for its verifier_error: reward_raised (rewards.plan's default)
        cause = (outcome.cause or "reward_raised") if outcome.status == "verifier_error" else None
        metadata: FinalMetadata = {
            "reward_components": dict(outcome.components),
            "reward_status": cast(RewardStatus, outcome.status),
            "reward_error_cause": cause,
            "format_ok": outcome.format_ok,
            "gate": cast("Gate | None", outcome.gate),
            "termination": termination,
            "code_pass": list(self.code_pass),
            "turns": self.turns,
            "exec": list(self.exec_log),
        }
        if outcome.error:
            metadata["error"] = outcome.error
        if outcome.details.get("notes"):
            metadata["reward_notes"] = dict(outcome.details["notes"])
        if self.judge_session is not None and self.judge_session.calls:
            metadata["judge"] = self.judge_session.summary()
        self.final_metadata = metadata
        self.final_reward = float(outcome.reward)
        return BaseTextEnvStepOutput(
            observations=[],
            reward=self.final_reward,
            done=True,
            metadata=dict(metadata),
            postprocessed_action=cut,
        )

    def get_metrics(self) -> dict[str, float]:
        """Numbers only, one dict per episode; skyrl_gym averages each key over the episodes that
        have it, so statuses, terminations and exec outcomes are given for every finished episode
        (0 or 1, or a per-turn fraction) and their means read as rates. ``finished`` 0 means the
        trainer stopped the episode (token budget) before the env said done; SkyRL adapters key on it.
        ``suspect`` is 1 for a finished episode the reward-hacking watch flags (its mean is the rate).
        ``verifier_error_<cause>`` is given for every episode, finished or not (0 unless it is a
        ``verifier_error`` of that cause), so its mean is the rate by cause over all episodes.
        """
        metrics: dict[str, float] = {"turns": self.turns, "finished": float(self.final_metadata is not None)}
        finals = [self.final_metadata] if self.final_metadata is not None else []
        for cause, rate in verifier_error_rates(finals).items():
            metrics[f"verifier_error_{cause}"] = rate
        if self.code_pass:
            metrics["code_pass_rate"] = sum(self.code_pass) / len(self.code_pass)
        if self.exec_log:
            for status in EXEC_STATUSES:
                hits = sum(1 for e in self.exec_log if e.get("status") == status)
                metrics[f"exec_{status}"] = hits / len(self.exec_log)
        if self.final_metadata is not None:
            meta = self.final_metadata
            metrics["reward"] = self.final_reward
            metrics["format_ok"] = float(meta["format_ok"])
            for status in REWARD_STATUSES:
                metrics[f"status_{status}"] = float(meta["reward_status"] == status)
            for termination in TERMINATIONS:
                metrics[f"termination_{termination}"] = float(meta["termination"] == termination)
            for name, value in meta["reward_components"].items():
                metrics[f"reward/{name}"] = value
            # the reward-hacking watch (core/hacking.py): 1 for a high score that looks wrong
            metrics["suspect"] = float(bool(suspect_reasons(Watched.of_env(self))))
        return metrics

    def result(self) -> EpisodeResult:
        """The episode so far (finished or not) as one value: what records serialise."""
        judge_model, judge_prompts = judge_versions(
            self.judge_client, self.plan.needs_judge if self.plan else []
        )
        return EpisodeResult(
            extras=self.extras,
            task_id=self.task_id,
            messages=list(self.messages),
            reward=self.final_reward,
            metadata=self.final_metadata.copy() if self.final_metadata is not None else None,
            code_pass=list(self.code_pass),
            turns=self.turns,
            exec=list(self.exec_log),
            timings=dict(self.timings),
            unfinished=self.unfinished_reason,
            versions={
                "package": package_version(),
                "profile": self.config.profile,
                "reward_plan": self.plan.fingerprint() if self.plan else None,
                "policy_id": self.config.policy_id,
                "judge_model": judge_model,
                "judge_prompts": judge_prompts,
                "kernel": self.kernel_versions,
            },
        )

    def close(self, *, record: bool = True, unfinished: str | None = None, keep_worker: bool = False) -> None:
        """Release the worker and scratch workspace; append the record when ``records_dir`` is set.

        ``record=False`` is for a caller abandoning an episode it could not finish (``rollout``
        when its policy fails or the run is interrupted): a half episode is not data.
        ``unfinished`` (a reason) records an episode that did not end as ``reward_status:
        "unfinished"`` with that reason as its ``error``, unscored: a served client that went
        away (``deepanalyze-rl serve``) is not a token budget. ``keep_worker`` records and removes the
        scratch folder but leaves the kernel worker, which another thread's cell still uses (a
        server stopping at once); a later ``close()`` ends it.
        """
        if self._closed:
            if not keep_worker and self.kernel is not None:
                self.kernel.close()  # what a close that kept the worker left (idempotent)
            return
        if unfinished is not None and self.final_metadata is None:
            self.unfinished_reason = unfinished
        elif record and self.final_metadata is None and self.turns > 0:
            # The trainer ended the loop without a final step: SkyRL's generator stops a trajectory
            # whose input outgrew max_input_length and closes the env. That is a token budget.
            try:
                self.end_for_length()
            except Exception:  # scoring must never keep the worker or scratch folder alive
                log.exception("could not score the episode closed for length")
        self._closed = True
        # The record is the episode as it stands now: taken before the worker and scratch go, so
        # a cell still running in another thread (keep_worker) cannot end the episode in between
        # (its workspace vanishing would read as an environment_error, not the close's reason).
        snapshot = build_record(self.result()) if record and self.config.records_dir else None
        if self.kernel is not None and not keep_worker:
            self.kernel.close()
        if self.workspace is not None:
            self.workspace.remove()
        if snapshot is not None:
            try:
                RecordWriter.for_dir(self.config.records_dir).append(snapshot)
            except OSError as exc:
                log.error("could not write the episode record to %s: %s", self.config.records_dir, exc)

    def __del__(self):  # a trainer that forgets close() must not leak workers or scratch folders
        try:
            if not self._closed and self.kernel is not None:
                self.kernel.close()
                if self.workspace is not None:
                    self.workspace.remove()
        except Exception:
            pass
