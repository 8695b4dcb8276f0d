"""Families that need structure: time series, a join across two files, SQL over SQLite."""

from __future__ import annotations

import random
from dataclasses import dataclass

from deepanalyze_env.offline.bank.families.base import (
    ANSWER_MARK,
    AnswerFormat,
    Cell,
    Draft,
    FamilyContext,
    answer_print,
    decimals_for,
    explore_cell,
    gate_line,
    imports,
    load_code,
    nice_threshold,
    num_text,
    pick,
    q,
    register_family,
    retired_check_draws,
)
from deepanalyze_env.offline.bank.families.basic import SINGLE, level_text, pick_level, single_ws
from deepanalyze_env.offline.bank.sources import TimeSpec

FREQ_WORD = {"W": "weekly", "M": "monthly", "Q": "quarterly", "Y": "yearly"}


@dataclass
class _TsAsk:
    """What every time-series question of one draft is built from."""

    ctx: FamilyContext
    rng: random.Random
    fname: str
    col: str
    tcol: str
    unit: str
    years: list[int]
    dec: int
    time: TimeSpec


@dataclass
class _TsQuestion:
    """One time-series question: its answer format, text, gate and reference code."""

    answer: AnswerFormat
    instruction: str
    calc_gate: str
    calc: str
    final: str
    ops: tuple[str, ...]
    key: str


def _ts_peak_year(t: _TsAsk) -> _TsQuestion:
    rng, fname, col, unit = t.rng, t.fname, t.col, t.unit
    high = rng.random() < 0.6
    word = "highest" if high else "lowest"
    answer = AnswerFormat("integer")
    instruction = pick(
        rng,
        [
            f"From {fname}, take {unit}. Which year has the {word} value of {col}? Answer with the year.",
            f"Looking at {unit} in {fname}, in which year was {col} at its {word}? Reply with the year only.",
        ],
    )
    asc = "False" if high else "True"
    calc_gate = f"s = yearly.dropna().sort_values(ascending={asc})\nresult = int(s.index[0])\nmargin = abs(float(s.iloc[0]) - float(s.iloc[1]))\nn = len(s)"
    calc = f"best = yearly.{'idxmax' if high else 'idxmin'}()\nprint(yearly.sort_values(ascending={asc}).head(3).round(4).to_string())"
    final = f"print('{ANSWER_MARK}', int(best))"
    ops, key = ("load", "parse dates", "resample", "argmax"), f"peak:{col}:{word}"
    return _TsQuestion(answer, instruction, calc_gate, calc, final, ops, key)


def _ts_slope(t: _TsAsk) -> _TsQuestion:
    rng, fname, col, unit, years, dec, ctx = t.rng, t.fname, t.col, t.unit, t.years, t.dec, t.ctx
    dec = decimals_for([float(ctx.frame[col].std()) / max(1, len(years))], base=3)
    answer = AnswerFormat("number", dec)
    instruction = (
        f"Using {fname}, take {unit} and fit a straight line (least squares) of those values against the year. "
        f"What is the slope, in units of {col} per year? Round to {dec} decimals."
    )
    calc_gate = "import numpy as np\ns = yearly.dropna()\nresult = float(np.polyfit(s.index.astype(float), s.values, 1)[0])\nn = len(s)\nmargin = None"
    calc = pick(
        rng,
        [
            "import numpy as np\ns = yearly.dropna()\nslope = np.polyfit(s.index.astype(float), s.values, 1)[0]",
            "from scipy import stats\ns = yearly.dropna()\nslope = stats.linregress(s.index.astype(float), s.values).slope",
        ],
    )
    final = answer_print(answer, "slope")
    ops, key = ("load", "parse dates", "resample", "trend fit"), f"slope:{col}"
    return _TsQuestion(answer, instruction, calc_gate, calc, final, ops, key)


def _ts_year_mean(t: _TsAsk) -> _TsQuestion:
    rng, fname, col, unit, years, dec = t.rng, t.fname, t.col, t.unit, t.years, t.dec
    year = pick(rng, years[1:-1] or years)
    answer = AnswerFormat("number", dec)
    instruction = (
        f"In {fname}, what is the average {col} over the year {year} ({unit})? Round to {dec} decimals."
    )
    calc_gate = f"result = float(yearly.loc[{year}])\nn = 1\nmargin = None"
    calc = f"value = yearly.loc[{year}]\nprint(yearly.loc[{year - 1}:{year + 1}].to_string())"
    final = answer_print(answer, "value")
    ops, key = ("load", "parse dates", "resample", "lookup"), f"yearmean:{col}:{year}"
    return _TsQuestion(answer, instruction, calc_gate, calc, final, ops, key)


def _ts_biggest_rise(t: _TsAsk) -> _TsQuestion:
    fname, col, unit = t.fname, t.col, t.unit
    answer = AnswerFormat("integer")
    instruction = (
        f"Using {fname} and {unit}, in which year did {col} rise the most compared with the previous year? "
        "Answer with the later year of the pair."
    )
    calc_gate = "d = yearly.dropna().diff().dropna().sort_values(ascending=False)\nresult = int(d.index[0])\nmargin = abs(float(d.iloc[0]) - float(d.iloc[1]))\nn = len(d)"
    calc = "change = yearly.dropna().diff()\nprint(change.sort_values(ascending=False).head(3).round(4).to_string())\nbest = change.idxmax()"
    final = f"print('{ANSWER_MARK}', int(best))"
    ops, key = ("load", "parse dates", "resample", "difference", "argmax"), f"rise:{col}"
    return _TsQuestion(answer, instruction, calc_gate, calc, final, ops, key)


def _ts_season(t: _TsAsk) -> _TsQuestion:
    fname, col, tcol, time = t.fname, t.col, t.tcol, t.time
    period, word = ("quarter", "quarter (1-4)") if time.freq == "Q" else ("month", "calendar month (1-12)")
    answer = AnswerFormat("integer")
    instruction = f"In {fname}, averaging {col} over all years, which {word} has the highest mean value? Answer with the number."
    calc_gate = f"m = df.groupby(df[{q(tcol)}].dt.{period})[{q(col)}].mean().sort_values(ascending=False)\nresult = int(m.index[0])\nmargin = float(m.iloc[0] - m.iloc[1])\nn = len(m)"
    calc = f"season = df.groupby(df[{q(tcol)}].dt.{period})[{q(col)}].mean()\nprint(season.round(4).to_string())\nbest = season.idxmax()"
    final = f"print('{ANSWER_MARK}', int(best))"
    ops, key = ("load", "parse dates", "seasonal mean", "argmax"), f"season:{col}"
    return _TsQuestion(answer, instruction, calc_gate, calc, final, ops, key)


def _ts_decade(t: _TsAsk) -> _TsQuestion:
    fname, col, tcol = t.fname, t.col, t.tcol
    answer = AnswerFormat("integer")
    instruction = (
        f"Group the years in {fname} into decades (1950 covers 1950-1959). Which decade has the highest mean {col}? "
        "Answer with the decade's first year."
    )
    calc_gate = f"m = df.groupby(df[{q(tcol)}] // 10 * 10)[{q(col)}].mean().sort_values(ascending=False)\nresult = int(m.index[0])\nmargin = float(m.iloc[0] - m.iloc[1])\nn = len(m)"
    calc = f"df['decade'] = df[{q(tcol)}] // 10 * 10\nby_decade = df.groupby('decade')[{q(col)}].mean()\nprint(by_decade.round(4).to_string())\nbest = by_decade.idxmax()"
    final = f"print('{ANSWER_MARK}', int(best))"
    ops, key = ("load", "bin years", "group mean", "argmax"), f"decade:{col}"
    return _TsQuestion(answer, instruction, calc_gate, calc, final, ops, key)


# mode -> question builder; each draws from the RNG in the order the old single function did
_TS_MODES = {
    "peak_year": _ts_peak_year,
    "slope": _ts_slope,
    "year_mean": _ts_year_mean,
    "biggest_rise": _ts_biggest_rise,
    "season": _ts_season,
    "decade": _ts_decade,
}


@register_family("timeseries", "verified", "trend, resampling and peaks of a time-indexed table", SINGLE)
def timeseries(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    time = ctx.spec.time
    nums = ctx.numeric()
    if time is None or not nums:
        return out
    tcol = time.column
    for _ in range(ctx.count):
        ws = single_ws(ctx)
        fname = ws.files[0]
        col = pick(rng, nums)
        if time.kind == "date":
            prep = f"df[{q(tcol)}] = pd.to_datetime(df[{q(tcol)}])\nyearly = df.groupby(df[{q(tcol)}].dt.year)[{q(col)}].mean()"
            prep_alt = f"df[{q(tcol)}] = pd.to_datetime(df[{q(tcol)}])\nyearly = df.set_index({q(tcol)})[{q(col)}].resample('YS').mean()\nyearly.index = yearly.index.year"
            unit = f"calendar-year means of the {FREQ_WORD[time.freq]} values (missing values ignored)"
        else:
            prep = f"yearly = df.groupby({q(tcol)})[{q(col)}].mean()"
            prep_alt = f"yearly = df.set_index({q(tcol)})[{q(col)}]"
            unit = f"the yearly values of {col}"
        years = sorted(int(y) for y in (ctx.frame[tcol].astype(str).str[:4].astype(int).unique()))
        modes = ["peak_year", "slope", "year_mean", "biggest_rise"]
        if time.kind == "date" and time.freq in ("M", "W", "Q"):
            modes.append("season")
        if time.kind == "year":
            modes.append("decade")
        mode = pick(rng, modes)
        dec = decimals_for(ctx.frame[col])
        q_ = _TS_MODES[mode](_TsAsk(ctx, rng, fname, col, tcol, unit, years, dec, time))
        answer, instruction, calc_gate, calc, final = (
            q_.answer,
            q_.instruction,
            q_.calc_gate,
            q_.calc,
            q_.final,
        )
        ops, key = q_.ops, q_.key
        if mode in ("season",) and time.kind == "date":
            prep_used, alt_used = (
                f"df[{q(tcol)}] = pd.to_datetime(df[{q(tcol)}])",
                f"df[{q(tcol)}] = pd.to_datetime(df[{q(tcol)}])",
            )
        elif mode == "decade":
            prep_used = alt_used = ""
        else:
            prep_used, alt_used = prep, prep_alt
        program = f"{imports(ws)}\n{load_code(ws, rng)}\n{prep_used}\n{calc_gate}\n" + gate_line(
            '{"answer": result, "n": n, "margin": margin}'
        )
        compute = f"{imports(ws)}\n{load_code(ws, rng)}\n{pick(rng, [prep_used, alt_used])}\n{calc}\n{final}"
        out.append(
            Draft(
                "timeseries",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, f"a time-series question on {col}"),
                    Cell(
                        f"The rows are indexed by {tcol}. I aggregate by year (or season) as asked and compute the result.",
                        compute,
                    ),
                ],
                f"Working from {unit}, the result is below.",
                ops,
                key=key,
            )
        )
        retired_check_draws(out[-1], rng)
    return out


def _merge_code(ws, rng) -> str:
    a, b = ws.files
    return pick(
        rng,
        [
            f"info = pd.read_csv({a!r})\nmeasures = pd.read_csv({b!r})\ndf = info.merge(measures, on='record_id')",
            f"info = pd.read_csv({a!r}).set_index('record_id')\nmeasures = pd.read_csv({b!r}).set_index('record_id')\ndf = info.join(measures, how='inner').reset_index()",
        ],
    )


def _join_question(ctx: FamilyContext, ws, rng):
    """A question that needs one column from each part: (text, pandas selection, sql where/group, key)."""
    measure = pick(rng, [c for c in ws.measure_columns if c != "record_id"])
    info_side = [c for c in ws.info_columns if c not in ("record_id",)]
    cats = [c for c in ctx.categorical() if c in info_side]
    nums = [c for c in ctx.numeric() if c in info_side]
    return measure, cats, nums


@register_family("join_aggregate", "verified", "join two files on a key, then aggregate", ("join",))
def join_aggregate(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    ws = ctx.workspaces.get("join")
    if ws is None:
        return out
    a, b = ws.files
    for _ in range(ctx.count):
        measure, cats, nums = _join_question(ctx, ws, rng)
        dec = decimals_for(ctx.frame[measure])
        if cats and rng.random() < 0.5:
            cat = pick(rng, cats)
            answer = AnswerFormat("text")
            instruction = pick(
                rng,
                [
                    f"{a} and {b} describe the same records (key record_id). Which value of {cat} (in {a}) has the "
                    f"highest mean {measure} (in {b})? Answer with the {cat} value.",
                    f"Combine {a} with {b} using their shared key record_id. Grouping by {cat}, which group has the "
                    f"largest average {measure}? Give the {cat} value only.",
                ],
            )
            gate = f"m = df.groupby({q(cat)})[{q(measure)}].mean().dropna().sort_values(ascending=False)\nresult = str(m.index[0])\nn = len(m)\nmargin = float(m.iloc[0] - m.iloc[1]) if len(m) > 1 else 0.0"
            calc = f"means = df.groupby({q(cat)})[{q(measure)}].mean()\nprint(means.round(4).to_string())\nbest = means.idxmax()"
            final = f"print('{ANSWER_MARK}', best)"
            key, ops = f"group:{cat}:{measure}", ("load two files", "join", "group", "argmax")
        else:
            if nums:
                col = pick(rng, nums)
                thr = nice_threshold(float(ctx.frame[col].quantile(pick(rng, [0.3, 0.5, 0.7]))))
                cond_text, cond = (
                    f"{col} (in {a}) is greater than {num_text(thr)}",
                    f"df[{q(col)}] > {num_text(thr)}",
                )
            elif cats:
                col = pick(rng, cats)
                level = pick_level(ctx, col)
                cond_text, cond = f"{col} (in {a}) equals {level}", f"df[{q(col)}] == {level_text(level)}"
            else:
                continue
            answer = AnswerFormat("number", dec)
            instruction = pick(
                rng,
                [
                    f"{a} and {b} describe the same records and share the key record_id. What is the mean {measure} "
                    f"(in {b}) of the records whose {cond_text}? Ignore missing values; round to {dec} decimals.",
                    f"Link the rows of {a} and {b} through record_id. For the records whose {cond_text}, what is the "
                    f"average {measure} (from {b}, missing values ignored)? Round to {dec} decimals.",
                ],
            )
            gate = f"sel = df.loc[{cond}, {q(measure)}].dropna()\nresult = float(sel.mean())\nn = len(sel)\nmargin = None"
            calc = f"sel = df.loc[{cond}, {q(measure)}]\nprint('matching records:', sel.notna().sum())\nvalue = sel.mean()"
            final = answer_print(answer, "value")
            key, ops = f"mean:{measure}:{cond_text}", ("load two files", "join", "filter", "mean")
        program = f"import pandas as pd\n{_merge_code(ws, rng)}\n{gate}\n" + gate_line(
            '{"answer": result, "n": n, "margin": margin}'
        )
        compute = f"import pandas as pd\n{_merge_code(ws, rng)}\nprint(df.shape)\n{calc}\n{final}"
        out.append(
            Draft(
                "join_aggregate",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, "a question that spans both files"),
                    Cell(
                        "The files share record_id; the measures file is in another row order, so I join on the key before aggregating.",
                        compute,
                    ),
                ],
                "After joining the two files on record_id, the aggregate is below.",
                ops,
                key=key,
            )
        )
    return out


@register_family("sql_query", "verified", "SQL over a SQLite database with two tables", ("sqlite",))
def sql_query(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    ws = ctx.workspaces.get("sqlite")
    if ws is None:
        return out
    db = ws.files[0]
    for _ in range(ctx.count):
        measure, cats, nums = _join_question(ctx, ws, rng)
        dec = decimals_for(ctx.frame[measure])
        mode = pick(rng, ["count", "avg", "group"] if cats else ["count", "avg"])
        if mode == "group":
            cat = pick(rng, cats)
            answer = AnswerFormat("text")
            instruction = (
                f"The SQLite database {db} has tables info and measures linked by record_id. Which {cat} (table info) "
                f"has the highest average {measure} (table measures)? Answer with the {cat} value."
            )
            sql = (
                f'SELECT i."{cat}" AS grp, AVG(m."{measure}") AS avg_value FROM info i JOIN measures m ON i.record_id = m.record_id '
                f'WHERE m."{measure}" IS NOT NULL GROUP BY i."{cat}" ORDER BY avg_value DESC'
            )
            gate = "res = pd.read_sql_query(sql, con)\nresult = str(res['grp'][0])\nn = len(res)\nmargin = float(res['avg_value'][0] - res['avg_value'][1]) if len(res) > 1 else 0.0"
            calc = "res = pd.read_sql_query(sql, con)\nprint(res.to_string())\nbest = res['grp'][0]"
            final = f"print('{ANSWER_MARK}', best)"
            key, ops = f"group:{cat}:{measure}", ("sql join", "group by", "order")
        else:
            if nums:
                col = pick(rng, nums)
                thr = nice_threshold(float(ctx.frame[col].quantile(pick(rng, [0.25, 0.5, 0.75]))))
                cond_text, where = (
                    f"{col} (table info) is below {num_text(thr)}",
                    f'i."{col}" < {num_text(thr)}',
                )
            elif cats:
                col = pick(rng, cats)
                level = pick_level(ctx, col)
                lit = f"'{level}'" if isinstance(level, str) else num_text(level)
                cond_text, where = f"{col} (table info) equals {level}", f'i."{col}" = {lit}'
            else:
                mthr = nice_threshold(float(ctx.frame[measure].quantile(0.5)))
                cond_text, where = f"{measure} is above {num_text(mthr)}", f'm."{measure}" > {num_text(mthr)}'
            if mode == "count":
                answer = AnswerFormat("integer")
                instruction = f"Using the SQLite database {db} (tables info and measures, joined by record_id): how many records satisfy both: {cond_text}, and {measure} is not missing? Answer with an integer."
                sql = f'SELECT COUNT(*) AS n FROM info i JOIN measures m ON i.record_id = m.record_id WHERE {where} AND m."{measure}" IS NOT NULL'
                gate = (
                    "res = pd.read_sql_query(sql, con)\nresult = int(res['n'][0])\nn = result\nmargin = None"
                )
                calc = "res = pd.read_sql_query(sql, con)\nprint(res)\nvalue = int(res['n'][0])"
            else:
                answer = AnswerFormat("number", dec)
                instruction = f"Query the SQLite database {db} (tables info and measures, joined by record_id): what is the average {measure} of the records where {cond_text}? Round to {dec} decimals."
                sql = f'SELECT AVG(m."{measure}") AS avg_value, COUNT(m."{measure}") AS n FROM info i JOIN measures m ON i.record_id = m.record_id WHERE {where}'
                gate = "res = pd.read_sql_query(sql, con)\nresult = None if res['avg_value'][0] is None else float(res['avg_value'][0])\nn = int(res['n'][0])\nmargin = None"
                calc = "res = pd.read_sql_query(sql, con)\nprint(res)\nvalue = float(res['avg_value'][0])"
            final = answer_print(answer, "value")
            key, ops = f"{mode}:{measure}:{cond_text}", ("sql join", "where", mode)
        head = f"import sqlite3\nimport pandas as pd\ncon = sqlite3.connect({db!r})\nsql = {sql!r}"
        program = f"{head}\n{gate}\ncon.close()\n" + gate_line('{"answer": result, "n": n, "margin": margin}')
        compute = f"{head}\nprint(sql)\n{calc}\ncon.close()\n{final}"
        out.append(
            Draft(
                "sql_query",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, "the question"),
                    Cell(
                        "I write one SQL query that joins info and measures on record_id and computes what is asked.",
                        compute,
                    ),
                ],
                "The SQL query over both tables returns the result below.",
                ops,
                key=key,
            )
        )
    return out
