"""Reference episodes: each kept task played through ``DeepAnalyzeEnv`` and recorded (SFT data).

An episode is: look at the files → compute → answer (three turns: the ``max_turns`` a policy is
trained and evaluated with, so every reference is SFT data), each turn an ``<Analyze>`` with
its reason and a fenced ``<Code>`` cell run by the real kernel; the answer turn is written from
what the episode's own code printed (the line after ``Final answer:``), not from the ground
truth, so the self-check compares two computations: the reference program's (the ground truth)
and the episode's (other idioms). The self-check then requires full marks on every
deterministic component (turn shaping excepted: it measures length, not correctness), and the
same plan, rescoring the episode's own context, must refuse what is not the answer: a
deliberately wrong answer scores 0 on every answer component; the ground truth moved by one
unit of its last printed digit (either way) scores 0 on it — the bank's tolerance is half
that unit, so a looser tolerance or a matcher blind to the last digit fails the build; for a
file task, the written file with one numeric cell moved past the file tolerance, or with the
task's raw input saved unchanged in its place (the cleaning left out), falls short of full
file marks. Rescoring costs no kernel time. Records follow the record contract; the fields that measure time
(``timings``, ``exec[].elapsed_ms``) are zeroed so that builds are byte-identical, and
``openresearch`` episodes, built without a judge, carry ``reward_status: verifier_error`` with
a fixed note — ``deepanalyze-rl rescore`` with a judge fills in the rubric scores.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING

from deepanalyze_env.core import driver
from deepanalyze_env.core.contracts import EpisodeRecord, JsonObject
from deepanalyze_env.core.driver import Turn
from deepanalyze_env.generation.turn_end import text_turn_end
from deepanalyze_env.offline.bank.families.base import ANSWER_MARK, Draft

if TYPE_CHECKING:
    from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput

    from deepanalyze_env.core.env import DeepAnalyzeEnv
    from deepanalyze_env.offline.bank.build import BankTask
    from deepanalyze_env.offline.bank.quality import ExpectedFile
    from rewards import RewardContext

ANSWER_COMPONENTS = (
    "answer_match",
    "answer_parts",
    "answer_parts_all",
    "file_schema",
    "file_rows",
    "file_values",
)
SHAPING = ("openresearch_turns",)
UNJUDGED = "not judged at build time (no judge configured); rescore with a judge"


@dataclass
class EpisodeCheck:
    """A reference episode played through the real env, and whatever kept it from scoring full marks
    (empty when it did)."""

    record: EpisodeRecord
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _turn(analyze: str, code: str) -> str:
    return f"<Analyze>\n{analyze}\n</Analyze>\n<Code>\n```python\n{code}\n```\n</Code>"


def _answer_from(outputs: list[str]) -> str | None:
    for text in reversed(outputs):
        pos = text.rfind(ANSWER_MARK)
        if pos >= 0:
            rest = text[pos + len(ANSWER_MARK) :]
            return rest.split("</Execute>")[0].strip()
    return None


def wrong_answer(answer: str, task: BankTask) -> str:
    """A value the ground truth rejects: numbers moved far outside the tolerance, text replaced."""
    from rewards.answers import PART

    def bump(value: str) -> str:
        try:
            number = float(value.replace(",", ""))
        except ValueError:
            return "not " + value
        if not math.isfinite(number):
            return "0"
        return repr(number + 1.0 + abs(number))

    if task["reward_spec"].get("function") == ["answer_parts"]:
        return " ".join(f"@{name}[{bump(value)}]" for name, value in PART.findall(answer)) or "@none[0]"
    return bump(answer)


@dataclass
class ReferenceTurns:
    """A draft's reference episode as the episode driver's turn source (``core/driver.py``): each
    cell a turn, then the answer written from what the cells printed; a cell that did not run
    cleanly is a problem. Each turn's end is read from its text as a scripted turn's is."""

    draft: Draft
    problems: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    value: str = ""  # the answer value the cells printed

    def __call__(self, previous: BaseTextEnvStepOutput | None) -> Turn:
        if previous is not None:
            status = previous["metadata"].get("exec", {}).get("status")
            text = previous["observations"][0]["content"] if previous["observations"] else ""
            if status != "ok":
                self.problems.append(f"cell {len(self.outputs) + 1} ended {status}: {text[-300:]}")
            self.outputs.append(text)
        if len(self.outputs) < len(self.draft.cells):
            cell = self.draft.cells[len(self.outputs)]
            return self._turn(_turn(cell.analyze, cell.code))
        value = _answer_from(self.outputs)
        if value is None:
            self.problems.append(f"no {ANSWER_MARK!r} line in the episode's output")
            value = ""
        self.value = value
        if self.draft.answer.kind == "report":
            answer_body = f"{self.draft.conclusion}\n{value}"
            closing = (
                "The figures come from the cells I ran; the saved chart shows the strongest association."
            )
        else:
            answer_body = f"{self.draft.conclusion}\n\nAnswer: {value}"
            closing = "The computation ran cleanly and printed the value asked for, in the requested format."
        return self._turn(f"<Analyze>\n{closing}\n</Analyze>\n<Answer>\n{answer_body}\n</Answer>")

    @staticmethod
    def _turn(text: str) -> Turn:
        return Turn(text, text_turn_end(text))


def env_config(workspace_root: Path, cache: Path, timeout_s: float) -> JsonObject:
    return {
        "workspace_root": str(workspace_root),
        "executor": {"timeout_s": timeout_s, "memory_mb": 4096},
        "judge": {"backend": "replay", "model": "none", "cache_path": str(cache)},
    }


def play(
    task: BankTask, draft: Draft, workspace_root: Path, cache: Path, timeout_s: float = 60.0
) -> EpisodeCheck:
    """Run the reference episode of ``task`` through the env, record it and self-check it."""
    from deepanalyze_env.core.env import DeepAnalyzeEnv
    from deepanalyze_env.core.records import build_record
    from deepanalyze_env.core.tasks import env_extras, task_to_row

    row = task_to_row(task, str(workspace_root))
    extras = env_extras(row) | {"episode_id": f"bank-{task['id']}"}
    env = DeepAnalyzeEnv(env_config(workspace_root, cache, timeout_s), extras)
    turns = ReferenceTurns(draft)
    problems = turns.problems
    try:
        env.init(row["prompt"])
        final = driver.play(env, turns)
        value = turns.value
        meta = final["metadata"]
        comps = meta.get("reward_components", {})
        judged = task["reward_spec"]["method"] == "openresearch"
        if not judged and meta.get("reward_status") != "scored":
            problems.append(f"reward_status {meta.get('reward_status')}: {meta.get('error')}")
        for name, score in comps.items():
            if name in SHAPING or (name.startswith("openresearch_") and name != "openresearch_code"):
                continue
            if score < 1.0:
                problems.append(f"reference scored {name}={score:.3f}")
        if not judged:
            problems += _perturbed_scores_below_full(env, task)
            problems += _wrong_scores_zero(env, task, value)
        record = build_record(env.result())
    finally:
        env.close(record=False)
    record["timings"] = {}
    for entry in record["exec"]:
        entry["elapsed_ms"] = 0.0
    if task["reward_spec"]["method"] == "openresearch":
        record["judge"] = None
        record["error"] = UNJUDGED
    return EpisodeCheck(record, problems)


def last_digit_moved(text: str, step: int) -> str | None:
    """``text`` moved by ``step`` units of its last printed digit (``3.14`` → ``3.15``, ``7`` →
    ``6``), or None when it is not a plain finite decimal."""
    try:
        number = Decimal(str(text).strip())
    except InvalidOperation:
        return None
    if not number.is_finite():
        return None
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    return str(number + step * Decimal(1).scaleb(exponent))


def _answer_scores(env: DeepAnalyzeEnv, ctx: RewardContext, answer: str) -> dict[str, float]:
    outcome = env.plan.score(dataclasses.replace(ctx, answer=answer))
    return {n: v for n, v in outcome.components.items() if n in ANSWER_COMPONENTS}


def _perturbed_scores_below_full(env: DeepAnalyzeEnv, task: BankTask) -> list[str]:
    """The perturbations of the module docstring, each rescored through the episode's plan."""
    spec = task["reward_spec"]
    ctx = env._context()
    problems: list[str] = []
    truth = spec.get("ground_truth")
    if "answer_parts" in spec.get("function", []):
        parts = [(str(name), str(value)) for name, value in truth]
        for i, (name, value) in enumerate(parts):
            for step in (1, -1):
                moved = last_digit_moved(value, step)
                if moved is None:
                    continue
                answer = " ".join(f"@{n}[{moved if j == i else v}]" for j, (n, v) in enumerate(parts))
                if _answer_scores(env, ctx, answer).get("answer_parts_all", 0.0) != 0.0:
                    problems.append(f"part {name} at {moved} (one unit off {value}) scored answer_parts_all")
    elif "answer_match" in spec.get("function", []) and isinstance(truth, str | int):
        for step in (1, -1):
            moved = last_digit_moved(str(truth), step)
            if moved is not None and _answer_scores(env, ctx, moved).get("answer_match", 0.0) != 0.0:
                problems.append(f"{moved} (one unit off the truth {truth}) scored answer_match")
    expected = spec.get("expected_file")
    if expected and ctx.workspace is not None:
        problems += _file_perturbations(env, ctx, expected)
    return problems


FILE_MARKS = ("file_schema", "file_rows", "file_values")


def _file_perturbations(env: DeepAnalyzeEnv, ctx: RewardContext, expected: ExpectedFile) -> list[str]:
    target = Path(ctx.workspace) / expected["name"]
    if not target.is_file():
        return []  # the reference check already names the missing file
    original = target.read_bytes()
    problems: list[str] = []
    rows = list(csv.reader(io.StringIO(original.decode("utf-8"))))
    tolerance = float(expected.get("tolerance", 1e-6))
    cell = next(
        (
            (r, c, Decimal(v))
            for r, row in enumerate(rows[1:], 1)
            for c, v in enumerate(row)
            if last_digit_moved(v, 1) is not None
        ),
        None,
    )
    try:
        if cell is not None:
            r, c, number = cell
            unit = Decimal(1).scaleb(int(number.as_tuple().exponent))
            rows[r][c] = str(number + max(unit, Decimal(repr(10 * tolerance))))
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="\n").writerows(rows)
            target.write_text(buffer.getvalue(), encoding="utf-8")
            if _full_file_marks(env, ctx):
                problems.append(f"{expected['name']} with {rows[r][c]} for {number} scored full file marks")
        raw = sorted(p for p in Path(env.source_workspace).glob("*.csv") if p.name != expected["name"])
        if raw:
            target.write_bytes(raw[0].read_bytes())
            if _full_file_marks(env, ctx):
                problems.append(f"{raw[0].name} saved unchanged as {expected['name']} scored full file marks")
    finally:
        target.write_bytes(original)
    return problems


def _full_file_marks(env: DeepAnalyzeEnv, ctx: RewardContext) -> bool:
    components = env.plan.score(ctx).components
    return all(components.get(name) == 1.0 for name in FILE_MARKS)


def _wrong_scores_zero(env: DeepAnalyzeEnv, task: BankTask, value: str) -> list[str]:
    ctx = env._context()
    expected = task["reward_spec"].get("expected_file")
    if expected:
        target = Path(ctx.workspace) / expected["name"]
        target.unlink(missing_ok=True)
    wrong = dataclasses.replace(ctx, answer=wrong_answer(value, task))
    outcome = env.plan.score(wrong)
    bad = [f"{n}={v:.3f}" for n, v in outcome.components.items() if n in ANSWER_COMPONENTS and v != 0.0]
    if outcome.status != "scored":
        return [f"wrong answer was not scored: {outcome.error}"]
    return [f"a wrong answer still scored {', '.join(bad)}"] if bad else []


def empty_judge_cache(folder: Path) -> Path:
    """An empty replay cache: openresearch plans need a judge to be built, none is called for real."""
    path = folder / "no-judge.sqlite"
    path.touch()
    return path
