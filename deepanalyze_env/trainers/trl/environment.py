"""TRL's own way to train against an environment: ``GRPOTrainer(environment_factory=…)``.

TRL makes one instance per rollout, calls ``reset(**row)`` with the dataset row, exposes every
public method as a tool the model calls through its chat template, masks the tool results
itself, and — because the instance defines ``get_reward`` — lets the environment own the
reward. :func:`environment_factory` returns the zero-argument callable TRL wants; each instance
drives a :class:`DeepAnalyzeEnv` in the ``tools`` action format, so its episodes get the same
tool set, gate, reward plan, statuses and records as every other path::

    from trl import GRPOConfig, GRPOTrainer
    from deepanalyze_env.trainers.trl.environment import environment_factory, tool_dataset_rows

    trainer = GRPOTrainer(
        model=model_name,
        args=GRPOConfig(mask_truncated_completions=True, ...),
        train_dataset=Dataset.from_list(tool_dataset_rows(rows, env_config)),
        environment_factory=environment_factory(env_config),
    )

What TRL decides and the env cannot see: a call TRL could not dispatch (an unknown tool name,
a missing or extra argument) never reaches the instance — TRL answers it with an error result —
so only the calls it dispatches meet the env's gate rules; the rollout's end (a message without
a call ends it: an episode not ended by ``submit_answer`` fails the gate, the same rule as
``termination: "eos"``; one cut by ``max_completion_length`` is TRL's to mask, hence
``mask_truncated_completions``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from deepanalyze_env.core import tool_calls
from deepanalyze_env.core.config import EnvConfig, to_plain
from deepanalyze_env.core.contracts import FinalMetadata, JsonObject, JsonValue, trainable
from deepanalyze_env.core.driver import Turn, apply_turn
from deepanalyze_env.core.env import DeepAnalyzeEnv, load_system_prompt
from deepanalyze_env.core.tool_calls import ParsedTurn, ToolCall, check_call
from deepanalyze_env.trainers.trl.rollout_func import MetricLogger, log_episode_metrics

log = logging.getLogger(__name__)

ENDED = "The analysis has ended: the answer was submitted or the turn limit reached; make no more calls."
NOT_STARTED = "No episode is running (reset was not called)."


class DeepAnalyzeToolEnvironment:
    """One rollout's environment for TRL's ``environment_factory``: ``reset`` starts an episode
    of a dataset row, the two public methods are the tools, ``get_reward`` is the env's reward
    (None for an episode that must not train: ``verifier_error`` or ``environment_error``)."""

    def __init__(self, env_config: JsonObject) -> None:
        self._config = env_config
        self._env: DeepAnalyzeEnv | None = None

    def reset(self, **row: JsonValue) -> None:
        """Start an episode of ``row`` (a dataset row of ours: ``prompt``, ``reward_spec`` as a
        mapping or JSON text, ``data``, ``workspace_id``, …); the previous one is closed (its
        record written when ``records_dir`` is set). Returns None: the prompt is the row's."""
        self._close()
        extras = {k: v for k, v in row.items() if k != "prompt"}
        self._env = DeepAnalyzeEnv(self._config, extras=extras)
        self._env.init(row.get("prompt") or "")

    def run_python(self, code: str) -> str:
        """Run Python code in the analysis kernel, whose working directory holds the task's data files.

        Args:
            code: Python source to run; print() what you want to see.

        Returns:
            What the code printed, errors included.
        """
        return self._call(tool_calls.RUN_PYTHON, {"code": code})

    def submit_answer(self, answer: str) -> str:
        """Submit the final answer and end the analysis.

        Args:
            answer: The final answer; for a single value, the value itself.

        Returns:
            A confirmation.
        """
        return self._call(tool_calls.SUBMIT_ANSWER, {"answer": answer})

    def get_reward(self) -> float | None:
        """The episode's reward once it has ended; an episode the model stopped without
        ``submit_answer`` ends here (``eos``: the gate fails). None for an episode that must stay
        out of the gradient, as the ``rollout_func`` path returns."""
        meta = self._final()
        # TRL masks a completion its budget cut (mask_truncated_completions); the env never ends
        # an episode for length on this path, so only the status decides
        if meta is None or not trainable(meta["reward_status"], meta["termination"], score_truncated=True):
            return None
        return self._env.final_reward if self._env is not None else None

    def _final(self) -> FinalMetadata | None:
        """The episode's final metadata, ending it first when the model stopped calling tools."""
        env = self._env
        if env is None:
            return None
        if env.final_metadata is None:  # the model ended its message without a call
            apply_turn(env, Turn("", "eos"))
        return env.final_metadata

    def _call(self, name: str, arguments: JsonObject) -> str:
        env = self._env
        if env is None:
            return NOT_STARTED
        if env.final_metadata is not None:
            return ENDED
        checked = check_call(name, arguments)
        if isinstance(checked, ToolCall):
            out = apply_turn(env, Turn("", call=ParsedTurn("", checked)))
        else:  # dispatched, yet not a valid action (an empty code string, say): the gate fails
            raw = json.dumps({"name": name, "arguments": arguments}, default=str)
            turn = ParsedTurn("", None, checked[0], checked[1])
            out = apply_turn(env, Turn(tool_calls.CALL_OPEN + raw + tool_calls.CALL_CLOSE, call=turn))
        if out["done"]:
            return ENDED if name != tool_calls.SUBMIT_ANSWER else "Answer submitted."
        return str(out["observations"][0]["content"])

    def _close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def __del__(self) -> None:  # TRL keeps a pool of instances; the last episodes close here
        try:
            self._close()
        except Exception:
            pass


def episode_metrics(
    environments: Sequence[object], log_metric: MetricLogger | None = None, **_: object
) -> list[float | None]:
    """A reward function for TRL's logs on this path (the train command adds it with weight 0):
    the batch's component means, statuses and terminations logged as on the ``rollout_func``
    path; it returns the env's rewards, which the weight keeps out of the total (``get_reward``
    is the reward)."""
    ours = [e for e in environments if isinstance(e, DeepAnalyzeToolEnvironment)]
    finals = [m for m in (e._final() for e in ours) if m is not None]
    if log_metric is not None and finals:
        log_episode_metrics(
            log_metric,
            [m["reward_components"] for m in finals],
            [m["reward_status"] for m in finals],
            [m["termination"] for m in finals],
            [m.get("reward_error_cause") for m in finals],
        )
    return [e.get_reward() if isinstance(e, DeepAnalyzeToolEnvironment) else None for e in environments]


class EnvironmentFactory:
    """The zero-argument callable TRL calls for each new instance; it keeps the instances it made
    so that :meth:`close` can end their last episodes (TRL reuses instances across batches and
    never closes them, and an episode's record is written when it closes)."""

    def __init__(self, env_config: JsonObject) -> None:
        self.env_config = env_config
        self.instances: list[DeepAnalyzeToolEnvironment] = []

    def __call__(self) -> DeepAnalyzeToolEnvironment:
        instance = DeepAnalyzeToolEnvironment(self.env_config)
        self.instances.append(instance)
        return instance

    def close(self) -> None:
        """Close every instance's episode (records written); call it after training."""
        for instance in self.instances:
            instance._close()


def environment_factory(env_config: EnvConfig | JsonObject | None = None) -> EnvironmentFactory:
    """The zero-argument callable for ``GRPOTrainer(environment_factory=…)``: ``env_config`` is
    validated once here. ``action_format`` is ``tools`` whatever it says, and the env adds no
    system prompt of its own: TRL generates from the dataset's prompt, where
    :func:`tool_dataset_rows` puts it, and the records keep that prompt as the model saw it. Call
    its ``close()`` after training so the last episodes are recorded."""
    config = {**to_plain(env_config), "action_format": "tools", "system_prompt": None}
    EnvConfig.from_any(config)
    return EnvironmentFactory(config)


def tool_dataset_rows(
    rows: Sequence[JsonObject], env_config: EnvConfig | JsonObject | None = None
) -> list[JsonObject]:
    """Rows for ``datasets.Dataset.from_list`` on this path: the prompt (with the tools system
    prompt when ``env_config.system_prompt`` names one, since TRL generates from the dataset's
    prompt), ``reward_spec`` as JSON text (Arrow cannot hold every task's spec in one column),
    and the task fields ``reset`` hands to the env."""
    config = EnvConfig.from_any({**to_plain(env_config), "action_format": "tools"})
    system = load_system_prompt(config.system_prompt, "tools")
    out = []
    for row in rows:
        prompt = row["prompt"]
        messages = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        )
        if system:
            if messages and messages[0].get("role") == "system":
                messages[0]["content"] = system + "\n\n" + messages[0]["content"]
            else:
                messages.insert(0, {"role": "system", "content": system})
        item: JsonObject = {"prompt": messages}
        for key in ("task_id", "data", "workspace_id", "input_seq", "max_turns"):
            if row.get(key) is not None:
                item[key] = row[key]
        spec = row.get("reward_spec")
        item["reward_spec"] = spec if isinstance(spec, str) else json.dumps(spec)
        out.append(item)
    return out
