"""What a task family produces (``Draft``), the registry, and the code snippets families share.

A family turns one table (its prepared frame, its written workspaces, a seeded RNG) into
drafts: the question, the answer format, a *reference program* that computes the answer and
prints what the quality gate needs as one JSON line, and the reference episode's cells (other
pandas idioms than the reference program where possible, so the self-check compares two
independent computations). Parameters (columns, thresholds, levels) may be chosen by looking at
the frame; the answer itself only ever comes from running the reference program in the kernel.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from deepanalyze_env.offline.bank.sources import TableSpec
from deepanalyze_env.offline.bank.workspaces import Workspace

GATE_MARK = "__GATE__"
ANSWER_MARK = "Final answer:"
AnswerKind = Literal["number", "integer", "text", "parts", "file", "report"]


@dataclass(frozen=True)
class Part:
    """One named part of a multi-part answer (``@name[value]``), with the kind and decimals its
    tolerance is derived from."""

    name: str
    kind: Literal["number", "integer", "text"]
    decimals: int | None = None


@dataclass
class AnswerFormat:
    """How a task's answer is written (a number, text, parts, a report or an output file): the
    instruction states it and the scorer is chosen from it."""

    kind: AnswerKind
    decimals: int | None = None
    parts: tuple[Part, ...] = ()
    file: str | None = None  # cleaning tasks: the output file the agent writes


@dataclass
class Cell:
    """One code turn of a reference episode: the analysis text and the code it runs."""

    analyze: str
    code: str


class Difficulty(TypedDict):
    """A bank task's difficulty: its level (from the reference's operation count), its code
    cells and the operations themselves."""

    level: Literal["easy", "medium", "hard"]
    cells: int
    operations: list[str]


@dataclass
class Draft:
    """A candidate task before the quality gate: its instruction, answer format and reference program;
    it becomes a task only if the real kernel's output gives an unambiguous ground truth."""

    family: str
    table: str
    workspace: Workspace
    instruction: str
    answer: AnswerFormat
    program: str  # the reference program; its last output line is GATE_MARK + JSON
    cells: list[Cell]  # the reference episode's code turns (the last prints ANSWER_MARK …)
    conclusion: str  # the answer turn's text before "Answer: …"
    operations: tuple[str, ...]  # what the reference does, for the difficulty
    method: str = "verified"
    key: str = ""  # what makes the draft unique within its family and table (for ids)

    @property
    def difficulty(self) -> Difficulty:
        ops = len(self.operations)
        level = "easy" if ops <= 2 else "medium" if ops <= 4 else "hard"
        return Difficulty(level=level, cells=len(self.cells), operations=list(self.operations))


@dataclass
class FamilyContext:
    """What a family's generator sees for one table: the table spec and prepared frame, the workspaces
    it may use, a seeded RNG and how many drafts to aim for."""

    spec: TableSpec
    frame: Any  # pandas.DataFrame, the prepared table
    workspaces: dict[str, Workspace]
    rng: random.Random
    count: int  # how many drafts to aim for

    def numeric(self, min_unique: int = 5) -> list[str]:
        return [c for c in self.spec.numeric if self.frame[c].nunique() >= min_unique]

    def categorical(self, max_levels: int = 12) -> list[str]:
        return [c for c in self.spec.categorical if 2 <= self.frame[c].nunique() <= max_levels]


FamilyFn = Callable[[FamilyContext], list[Draft]]


@dataclass(frozen=True)
class Family:
    """A parameterised task family (name, method, generator): the unit the bank is built and stratified
    by."""

    name: str
    method: str
    description: str
    make: FamilyFn
    kinds: tuple[str, ...] = field(default=())


FAMILIES: dict[str, Family] = {}


def register_family(name: str, method: str, description: str, kinds: tuple[str, ...]):
    def decorator(fn: FamilyFn) -> FamilyFn:
        FAMILIES[name] = Family(name, method, description, fn, kinds)
        return fn

    return decorator


# ------------------------------------------------------------------------------- snippets


def q(name: str) -> str:
    """A column name as a Python string literal."""
    return repr(str(name))


def pick(rng: random.Random, options):
    return options[rng.randrange(len(options))]


def load_code(ws: Workspace, rng: random.Random, var: str = "df") -> str:
    """Reading a single-table workspace, in one of a few styles."""
    name = ws.files[0]
    if ws.kind in ("csv", "messy"):
        return pick(
            rng,
            [
                f"{var} = pd.read_csv({name!r})",
                f"path = {name!r}\n{var} = pd.read_csv(path)",
                f"{var} = pd.read_csv({name!r}, sep=',')",
            ],
        )
    if ws.kind == "json":
        return pick(
            rng,
            [
                f"with open({name!r}) as fh:\n    {var} = pd.DataFrame(json.load(fh))",
                f"{var} = pd.DataFrame(json.loads(open({name!r}).read()))",
            ],
        )
    if ws.kind == "xlsx":
        return pick(
            rng,
            [
                f"{var} = pd.read_excel({name!r}, sheet_name='data')",
                f"{var} = pd.ExcelFile({name!r}).parse('data')",
            ],
        )
    raise ValueError(f"load_code: workspace kind {ws.kind} has more than one table")


def imports(ws: Workspace, extra: str = "") -> str:
    lines = ["import pandas as pd"]
    if ws.kind == "json":
        lines.append("import json")
    if ws.kind == "sqlite":
        lines.append("import sqlite3")
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def explore_cell(ws: Workspace, rng: random.Random, what: str) -> Cell:
    """The first turn: look at the files before computing anything."""
    if ws.kind == "sqlite":
        db = ws.files[0]
        code = (
            f"import sqlite3\nimport pandas as pd\ncon = sqlite3.connect({db!r})\n"
            "tables = pd.read_sql_query(\"SELECT name FROM sqlite_master WHERE type='table' ORDER BY name\", con)\n"
            "print(tables)\n"
            "for t in tables['name']:\n"
            "    n = pd.read_sql_query(f'SELECT COUNT(*) AS n FROM {t}', con)['n'][0]\n"
            "    cols = pd.read_sql_query(f'PRAGMA table_info({t})', con)['name'].tolist()\n"
            "    print(t, n, 'rows:', cols)\n"
            "print(pd.read_sql_query('SELECT * FROM info LIMIT 3', con))\ncon.close()"
        )
        return Cell(
            f"The database file should hold the data for {what}. I will list its tables, their sizes and columns first.",
            code,
        )
    if ws.kind == "join":
        a, b = ws.files
        code = (
            f"import pandas as pd\nleft = pd.read_csv({a!r})\nright = pd.read_csv({b!r})\n"
            "for name, t in (('info', left), ('measures', right)):\n"
            "    print(name, t.shape)\n    print(t.head(3).to_string())\n"
            f"print('shared columns:', sorted(set(left.columns) & set(right.columns)))"
        )
        return Cell(
            f"There are two files. To answer {what} I need to know how they relate, so I will look at both and find the column they share.",
            code,
        )
    style = rng.randrange(3)
    load = load_code(ws, rng)
    head = imports(ws)
    # shape, dtypes and three rows at most: a whole printed frame (``describe().T``, ``head()``
    # of a wide table) costs hundreds of observation tokens in every reference episode, the SFT
    # data, and tells the next cell nothing more than the column names and types
    if ws.kind == "xlsx" and style == 0:
        code = f"{head}\nprint(pd.ExcelFile({ws.files[0]!r}).sheet_names)\n{load}\nprint(df.shape)\nprint(df.head(3).to_string())"
    elif ws.kind == "messy" or style == 1:
        code = f"{head}\n{load}\nprint(df.shape)\nprint(df.dtypes.to_string())\nprint('missing per column:')\nprint(df.isna().sum().to_string())"
    elif style == 2:
        code = f"{head}\n{load}\nprint(df.shape)\nprint(df.dtypes.to_string())\nprint(df.head(3).to_string())"
    else:
        code = f"{head}\n{load}\nprint(df.shape)\nprint(df.head(3).to_string())"
    intro = pick(
        rng,
        [
            f"To answer {what} I first load the data and check its columns, types and size.",
            f"I will start by inspecting the file: shape, column names and a few values, before computing {what}.",
            f"Before computing {what}, I look at the table to confirm the column names and how values are stored.",
        ],
    )
    return Cell(intro, code)


def gate_line(payload: str) -> str:
    """Code that prints the gate JSON (``payload`` is a dict expression)."""
    return (
        "import json as _json\n"
        f"print({GATE_MARK!r} + _json.dumps({payload}, default=lambda o: o.item() if hasattr(o, 'item') else str(o)))"
    )


def fmt_print(expr: str, part: Part | None = None, decimals: int | None = None, kind: str = "number") -> str:
    """An f-string fragment formatting ``expr`` the way the question asks."""
    if part is not None:
        kind, decimals = part.kind, part.decimals
    if kind == "integer":
        return f"{{int({expr})}}"
    if kind == "text":
        return f"{{{expr}}}"
    return f"{{{expr}:.{decimals}f}}"


def answer_print(answer: AnswerFormat, exprs: dict[str, str] | str) -> str:
    if answer.kind == "parts":
        assert isinstance(exprs, dict)
        body = " ".join(f"@{p.name}[{fmt_print(exprs[p.name], p)}]" for p in answer.parts)
    else:
        assert isinstance(exprs, str)
        body = fmt_print(exprs, decimals=answer.decimals, kind=answer.kind)
    return f'print(f"{ANSWER_MARK} {body}")'


def decimals_for(values, base: int = 2) -> int:
    """Enough decimals that the rounded answer keeps ~3–4 significant digits."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    scale = float(np.median(np.abs(arr))) if arr.size else 1.0
    if scale == 0 or not math.isfinite(scale):
        return base
    return int(min(6, max(base, 3 - math.floor(math.log10(scale)))))


def nice_threshold(value: float) -> float:
    """A round number near ``value`` (two significant digits), as a person would write it."""
    if value == 0 or not math.isfinite(value):
        return 0.0
    digits = 1 - math.floor(math.log10(abs(value)))
    out = round(value, digits)
    return float(int(out)) if out == int(out) else out


def num_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


CHECK_RATE = 0.35


def retired_check_draws(draft: Draft, rng: random.Random) -> None:
    """Make the draws of the check turn the references once had, and add no turn.

    References used to end, one time in three, with a check cell (the used columns' range and
    missing values) before the answer: four turns, which a policy evaluated at ``max_turns: 3``
    (inspect, compute, answer) cannot play, so those references were cut before their answer
    and were no SFT data. The check fed nothing into the answer, so it is gone; its RNG draws
    (the coin, a load style, a sentence) are still made, so that every later draft of the
    family and table keeps its question, its ground truth and its id."""
    if rng.random() >= CHECK_RATE or draft.workspace.kind not in ("csv", "json", "xlsx", "messy"):
        return
    load_code(draft.workspace, rng)  # the check cell's load style
    rng.randrange(2)  # its sentence
