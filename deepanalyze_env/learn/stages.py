"""Stages: each one an ordinary ``deepanalyze-rl`` command in its own process, identified by its
arguments and the contents of what it reads, reused or resumed from ``stages.json``.

Why separate processes rather than calls in this one (docs/design.md, the learn pipeline): a
stage's memory (a trainer, an eval policy's model) goes back to the system when it ends, a stage
that crashes or is killed by the out-of-memory killer takes only itself down, with its exit
named, and ``stages.json`` keeps each stage's command line, which a user can rerun by hand. The
commands are typed (``commands.py``) and their results are read through the readers of the
modules that write them (``offline/eval_report.read_report``, ``trainers/trl/train.read_step_lines``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from rich.console import Console
from rich.rule import Rule

from deepanalyze_env.core.memory import PeakFigures, gib, host_oom_kills, overall, wait_measuring
from deepanalyze_env.learn.commands import StageCommand, command_line, identity, resumed

# the pipeline's progress, as the commands it runs print theirs (a fixed width when piped to a log)
console = Console(width=None if sys.stdout.isatty() else 150)


class StageFailed(Exception):
    """A stage that ended without a result the pipeline can read (it crashed, or wrote no
    report); the message names the stage and the command that reruns it by hand."""


FULL_HASH_BYTES = 64 * 2**20  # files up to this size are hashed whole
EDGE_BYTES = 2**20  # of a larger file (weights): its first and last MiB, with its size and mtime


def content_digest(path: Path) -> str:
    """A digest of a file or a whole folder (a model: weights, config, tokenizer, checkpoints).

    Every file's relative path and size enter it; files up to :data:`FULL_HASH_BYTES` (configs,
    weight indexes, tokenizers, task files, rewritten by every ``learn`` run) are hashed whole,
    larger ones (weights) by their mtime and first and last MiB. A model rewritten in place
    changes its mtime (and almost always its edges), so a stage that read it reruns; the cost
    stays a few milliseconds per model instead of seconds per GB (``benchmarks/RESULTS.md``).
    """
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        st = file.stat()
        name = file.name if file == path else file.relative_to(path).as_posix()
        h.update(f"{name}\0{st.st_size}\0".encode())
        with open(file, "rb") as fh:
            if st.st_size <= FULL_HASH_BYTES:
                h.update(fh.read())  # its content is its identity (rewritten unchanged: the same)
            else:
                h.update(f"{st.st_mtime_ns}\0".encode())
                h.update(fh.read(EDGE_BYTES))
                fh.seek(st.st_size - EDGE_BYTES)
                h.update(fh.read(EDGE_BYTES))
    return h.hexdigest()[:16]


def model_inputs(ref: str) -> list[Path]:
    """What a stage reading model ``ref`` reads from disk: a local folder or file, or an embedded
    model's packaged GGUF (its conversion is a function of it). A hub id has no local content
    before it is downloaded; its name in the arguments is its identity."""
    from deepanalyze_env.generation.models import embedded_gguf

    if ref.startswith("embedded:"):
        try:
            folder, filename = embedded_gguf(ref.split(":", 1)[1])
        except ValueError:
            return []  # the stage itself says what is wrong
        return [folder / filename]
    path = Path(ref)
    return [path] if path.exists() else []


def _digests(inputs: Sequence[Path]) -> dict[str, str]:
    """Content digests of everything a stage reads: same arguments over changed task files, env
    config, recipe, SFT data or model (folder) are different work."""
    return {str(p): content_digest(p) for p in inputs if p.exists()}


class StageEntry(TypedDict):
    """One stage in ``stages.json``: its command line (less ``--resume``), its inputs' digests,
    its seconds (None: started, not finished) and peak memory, and why it is incomplete."""

    argv: list[str]
    inputs: dict[str, str]
    seconds: float | None
    memory: NotRequired[PeakFigures]
    incomplete: NotRequired[str]


class Stages:
    """Runs commands as stages, reusing those whose arguments are unchanged (``stages.json``).

    A stage is identified by its arguments and its input files' contents. It is reused when it
    finished with the same identity and no earlier stage reran; an eval or rollout interrupted
    with the same identity resumes episode by episode; anything else starts in a clean folder
    (resuming a folder made with other arguments or from an earlier model would mix episodes).
    """

    def __init__(self, out: Path, fresh: bool) -> None:
        self.path = out / "stages.json"
        self.done: dict[str, StageEntry] = (
            {} if fresh or not self.path.is_file() else json.loads(self.path.read_text())
        )
        self.seconds: dict[str, float] = {}
        self.memory: dict[str, PeakFigures] = {}  # each stage's peak (its process tree), this run or reused
        self.stale = False  # once one stage reruns, every later stage reruns too

    def run(
        self,
        name: str,
        title: str,
        command: StageCommand,
        outputs: Path | None = None,
        inputs: Sequence[Path] = (),
        check: Callable[[Path, float], Gap | None] | None = None,
    ) -> None:
        """Run ``command`` as stage ``name``, or reuse or resume it (see the class); an eval or
        rollout (``command.resumable``) that ends incomplete is tried once more at once."""
        console.print(Rule(f"[bold]{title}[/bold]"))
        digests = _digests(inputs)
        previous = self.done.get(name)
        argv = identity(command)
        same = previous is not None and previous["argv"] == argv and previous.get("inputs", {}) == digests
        finished = same and previous is not None and previous.get("seconds") is not None
        if not self.stale and finished and (outputs is None or outputs.exists()):
            console.print(f"reused: {name} (finished earlier with the same arguments and inputs)")
            self.seconds[name] = previous["seconds"]
            if previous.get("memory"):
                self.memory[name] = previous["memory"]
            return
        resumable = command.resumable
        resume = (
            resumable and not self.stale and same and outputs is not None and (outputs / "run.json").is_file()
        )
        self.stale = True
        if outputs is not None and outputs.exists() and not resume:
            shutil.rmtree(outputs)  # another stage's arguments, inputs or model made it: start clean
        if resume:
            command = resumed(command)
            console.print(f"resuming: {name} (started earlier with the same identity, not complete)")
        self.done[name] = {"argv": argv, "inputs": digests, "seconds": None}  # started
        self._save()
        start = time.monotonic()
        gap = self._execute(name, command, outputs, check)
        if gap is not None and resumable and outputs is not None:
            # an incomplete or crashed stage is not done: one more try, resuming what it has
            if (outputs / "run.json").is_file():
                console.print(
                    f"[yellow]stage {name} is incomplete[/yellow] ({gap.reason}): resuming its missing "
                    "episodes (--resume)",
                    highlight=False,
                )
                command = resumed(command)
            else:
                console.print(
                    f"[yellow]stage {name} did not start a run[/yellow] ({gap.reason}): rerunning it in a "
                    "clean folder",
                    highlight=False,
                )
                if outputs.exists():
                    shutil.rmtree(outputs)
            gap = self._execute(name, command, outputs, check)
        seconds = round(time.monotonic() - start, 1)
        self.seconds[name] = seconds
        if gap is None:
            self.done[name]["seconds"] = seconds
            self._save()
            return
        # still incomplete: not recorded as done, so the next ``learn`` resumes it
        self.done[name]["incomplete"] = gap.reason
        self._save()
        if not gap.usable:
            raise StageFailed(f"stage {name} failed ({gap.reason}): {command_line(command)}")
        console.print(
            f"[red]stage {name} is still incomplete[/red] ({gap.reason}); its figures count what is "
            "missing as failures, and the next learn run resumes it",
            highlight=False,
        )

    def _save(self) -> None:
        self.path.write_text(json.dumps(self.done, indent=1) + "\n")

    def _execute(
        self,
        name: str,
        command: StageCommand,
        outputs: Path | None,
        check: Callable[[Path, float], Gap | None] | None,
    ) -> Gap | None:
        """Run the stage's command once, measuring its process tree's peak memory; what is
        missing from its result, or None when complete."""
        console.print(command_line(command), style="dim", markup=False, highlight=False)
        since = time.time()
        ooms = host_oom_kills()
        # its own process: every stage loads a model, and memory a finished stage held (a trainer,
        # an eval policy) goes back to the system before the next one starts
        code, peak = run_command(command)
        if peak is not None:
            if name in self.memory:  # a retried stage: its peak over both tries
                peak = overall({"first": self.memory[name], "retry": peak}) or peak
            self.memory[name] = peak
            self.done[name]["memory"] = peak
            self._save()
            console.print(
                f"{name}: peak memory {gib(peak['peak_pss_bytes'])} (PSS of its process tree; "
                f"RSS {gib(peak['peak_rss_bytes'])})",
                style="dim",
                highlight=False,
            )
        if check is not None and outputs is not None:
            gap = check(outputs, since)
            if gap is not None or code == 0:
                return gap
        if code != 0:
            return Gap(exit_reason(name, code, peak, ooms), usable=False)
        return None


def run_command(command: StageCommand) -> tuple[int, PeakFigures | None]:
    """``deepanalyze-rl ARGV`` in its own process: its exit code and its process tree's peak."""
    proc = subprocess.Popen([sys.executable, "-m", "deepanalyze_env.cli", *command.argv()])
    return wait_measuring(proc)


# What to lower when a stage runs out of memory, by the stage's kind (the pipeline file's keys).
MEMORY_HINTS = {
    "grpo": "grpo.set.trl.max_completion_length, grpo.set.trl.per_device_train_batch_size (micro-batch) "
    "or grpo.set.trl.gradient_accumulation_steps (episodes per step)",
    "sft": "sft.set.trl.per_device_train_batch_size or sft.set.trl.max_length",
    "eval": "eval.concurrency (episodes whose turns are generated as one batch) or eval.max_tokens",
    "estimate": "eval.concurrency or curriculum.samples",
    "rft_sample": "eval.concurrency or rft.max_tokens",
    "rft_sft": "rft.set.trl.per_device_train_batch_size or rft.set.trl.max_length",
}


def exit_reason(name: str, code: int, peak: PeakFigures | None, ooms_before: int | None) -> str:
    """Why a stage's process ended badly, in one line: a SIGKILL while the host's OOM-kill counter
    moved is the kernel's out-of-memory killer, said with the stage's peak and what to lower."""
    if code == -9:
        ooms_after = host_oom_kills()
        if ooms_before is not None and ooms_after is not None and ooms_after > ooms_before:
            kind = next((k for k in MEMORY_HINTS if name.startswith(k)), "eval")
            at = f" at {gib(peak['peak_rss_bytes'])} resident" if peak is not None else ""
            return (
                f"killed by the kernel's out-of-memory killer{at}; the machine has less memory than "
                f"this stage needs: lower {MEMORY_HINTS[kind]}"
            )
        return "killed by SIGKILL (exit code -9), not by the out-of-memory killer"
    return f"exit code {code}"


@dataclass(frozen=True)
class Gap:
    """Why a stage is not complete, and whether what it left can still be read (an eval's report
    over its planned episodes, missing ones counted as failures)."""

    reason: str
    usable: bool


def eval_gap(folder: Path, since: float) -> Gap | None:
    """An eval is complete when it wrote its report in this run and no planned episode is missing."""
    from deepanalyze_env.offline.eval_report import read_report

    report = folder / "report.json"
    if not report.is_file() or report.stat().st_mtime < since:
        return Gap("it wrote no report: it crashed", usable=False)
    counts = read_report(folder)["episodes"]
    if counts["missing"]:
        return Gap(f"{counts['missing']} of {counts['planned']} planned episodes did not finish", usable=True)
    return None


def rollout_gap(folder: Path, since: float) -> Gap | None:
    """A rollout is complete when it rebuilt ``episodes.jsonl`` in this run with every planned
    episode in it (the SFT data of a partial reference run is what it kept, and says so)."""
    from deepanalyze_env.offline.eval_report import load_eval

    episodes = folder / "episodes.jsonl"
    if not episodes.is_file() or episodes.stat().st_mtime < since:
        return Gap("it wrote no episodes.jsonl: it crashed", usable=False)
    counts = load_eval(folder)[1]
    if counts.get("missing"):
        return Gap(f"{counts['missing']} of {counts['planned']} planned episodes did not finish", usable=True)
    return None
