"""The pipeline's stages as typed commands: the one place a stage's ``deepanalyze-rl`` argv is built.

Each stage runs an ordinary command in its own process (``stages.py`` says why); what it runs is
one of these settings objects, and :meth:`argv` is the only code that turns settings into flags.
The argv is also a stage's identity in ``stages.json`` and what a user reruns by hand, so a
setting that changes it changes the stage; ``resume`` never does (``identity`` drops it).
``tests/test_learn.py`` parses every argv back with the CLI's own parser.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from deepanalyze_env.core.contracts import JsonObject

REFERENCE_KEEP = 'reward_status == "scored" and format_ok'  # the reference episodes that are SFT data


@dataclass(frozen=True)
class BankCommand:
    """``bank build`` of the pipeline's slice of the task bank."""

    resumable: ClassVar[bool] = False
    out: Path
    families: tuple[str, ...] = ()  # none: every family
    tables: tuple[str, ...] = ()  # none: every table
    seed: int | None = None  # None: the command's default

    def argv(self) -> list[str]:
        argv = ["bank", "build", "--out", str(self.out)]
        if self.families:
            argv += ["--families", *sorted(self.families)]
        if self.tables:
            argv += ["--tables", *sorted(self.tables)]
        if self.seed is not None:
            argv += ["--seed", str(self.seed)]
        return argv


@dataclass(frozen=True)
class EvalCommand:
    """``eval`` of a model on a task file (the dev/test evals, the sampled pass, the estimate)."""

    resumable: ClassVar[bool] = True
    model: str
    tasks: Path
    out: Path
    config: Path  # the pipeline's env config
    samples: int
    max_tokens: int
    temperature: float
    concurrency: int
    chat_template_kwargs: JsonObject = dataclasses.field(default_factory=dict)
    chat_template: str | None = None
    resume: bool = False

    def argv(self) -> list[str]:
        argv = ["eval", "--model", self.model, "--tasks", str(self.tasks), "--samples", str(self.samples)]
        argv += ["--out", str(self.out), "--config", str(self.config)]
        argv += ["--max-tokens", str(self.max_tokens), "--temperature", str(self.temperature)]
        if self.chat_template_kwargs:
            argv += ["--chat-template-kwargs", json.dumps(self.chat_template_kwargs, sort_keys=True)]
        if self.chat_template:
            argv += ["--chat-template", self.chat_template]
        argv += ["--concurrency", str(self.concurrency)]
        return [*argv, "--resume"] if self.resume else argv


@dataclass(frozen=True)
class RolloutCommand:
    """``rollout --policy scripted`` of reference trajectories through the env (the SFT data)."""

    resumable: ClassVar[bool] = True
    trajectories: Path
    tasks: Path
    config: Path
    out: Path
    labels: str = "good"
    keep: str = REFERENCE_KEEP
    resume: bool = False

    def argv(self) -> list[str]:
        argv = ["rollout", "--policy", "scripted", "--labels", self.labels]
        argv += ["--trajectories", str(self.trajectories), "--tasks", str(self.tasks)]
        argv += ["--config", str(self.config), "--out", str(self.out), "--keep", self.keep]
        return [*argv, "--resume"] if self.resume else argv


@dataclass(frozen=True)
class TrainCommand:
    """``train`` of a recipe (SFT or GRPO) with the pipeline's keys set on top of it."""

    resumable: ClassVar[bool] = False
    recipe: str
    output_dir: Path
    model: str
    data: Path
    env: JsonObject | None = None  # the env config GRPO's rollouts run (SFT has none)
    overrides: tuple[str, ...] = ()  # ``key=value`` recipe overrides: the stage's ``set``, then ours

    def argv(self) -> list[str]:
        argv = ["train", self.recipe, f"output_dir={self.output_dir}", f"model={self.model}"]
        argv.append(f"data=[{self.data}]")
        if self.env is not None:
            argv.append(f"env={json.dumps(self.env)}")
        return [*argv, *self.overrides]


StageCommand = BankCommand | EvalCommand | RolloutCommand | TrainCommand


def command_line(command: StageCommand) -> str:
    """The command as a user types it (the console's progress, an error that says how to rerun)."""
    return "deepanalyze-rl " + " ".join(command.argv())


def identity(command: StageCommand) -> list[str]:
    """A stage's arguments less ``--resume`` (which does not change what the stage produces)."""
    if isinstance(command, EvalCommand | RolloutCommand) and command.resume:
        return dataclasses.replace(command, resume=False).argv()
    return command.argv()


def resumed(command: StageCommand) -> StageCommand:
    """The same command finishing the run its folder holds (``--resume``)."""
    if not isinstance(command, EvalCommand | RolloutCommand):
        raise TypeError(f"{command.argv()[0]} cannot resume")
    return dataclasses.replace(command, resume=True)
