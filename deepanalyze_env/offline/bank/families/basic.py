"""Single-table families: filtered counts, descriptive statistics, group rankings, shares, missing values."""

from __future__ import annotations

from deepanalyze_env.offline.bank.families.base import (
    AnswerFormat,
    Cell,
    Draft,
    FamilyContext,
    Part,
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
from deepanalyze_env.offline.bank.workspaces import _plain

OPS = [(">", "greater than"), ("<", "less than"), (">=", "at least"), ("<=", "at most")]
SINGLE = ("csv", "json", "xlsx")


def single_ws(ctx: FamilyContext):
    options = [ctx.workspaces[k] for k in SINGLE if k in ctx.workspaces]
    return pick(ctx.rng, options)


def level_text(value) -> str:
    return repr(_plain(value))


def pick_level(ctx: FamilyContext, cat: str):
    levels = sorted(ctx.frame[cat].dropna().unique().tolist(), key=lambda v: (str(type(v)), v))
    return _plain(pick(ctx.rng, levels))


@register_family("filter_count", "verified", "rows matching one or two conditions (integer)", SINGLE)
def filter_count(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums, cats = ctx.numeric(), ctx.categorical()
    for _ in range(ctx.count):
        if not nums:
            break
        col = pick(rng, nums)
        thr = nice_threshold(float(ctx.frame[col].quantile(pick(rng, [0.2, 0.35, 0.5, 0.65, 0.8]))))
        op, op_text = pick(rng, OPS)
        cond = f"(df[{q(col)}] {op} {num_text(thr)})"
        extra_text = ""
        if cats and rng.random() < 0.45:
            cat = pick(rng, cats)
            level = pick_level(ctx, cat)
            cond += f" & (df[{q(cat)}] == {level_text(level)})"
            extra_text = f" and {cat} equal to {level}"
        ws = single_ws(ctx)
        fname = ws.files[0]
        instruction = pick(
            rng,
            [
                f"In {fname}, how many rows have {col} {op_text} {num_text(thr)}{extra_text}? Answer with a single integer.",
                f"Count the records in {fname} whose {col} is {op_text} {num_text(thr)}{extra_text}. Give the count as an integer.",
                f"Using {fname}: how many entries satisfy {col} {op} {num_text(thr)}{extra_text}? Reply with one integer.",
            ],
        )
        answer = AnswerFormat("integer")
        program = (
            f"{imports(ws)}\n{load_code(ws, rng)}\nmask = {cond}\nresult = int(mask.sum())\n"
            + gate_line('{"answer": result, "n": result}')
        )
        style = rng.randrange(3)
        calc = [
            f"mask = {cond}\ncount = int(mask.sum())",
            f"subset = df[{cond}]\ncount = len(subset)",
            f"count = df.loc[{cond}].shape[0]",
        ][style]
        compute = f"{imports(ws)}\n{load_code(ws, rng)}\n{calc}\nprint('rows in table:', len(df))\n{answer_print(answer, 'count')}"
        cells = [
            explore_cell(ws, rng, f"the number of rows with {col} {op_text} {num_text(thr)}{extra_text}"),
            Cell(
                pick(
                    rng,
                    [
                        f"The column {col} is numeric. I apply the condition {col} {op} {num_text(thr)}{extra_text} and count the matching rows.",
                        f"I will build a boolean mask for {col} {op} {num_text(thr)}{extra_text} and count how many rows it keeps.",
                    ],
                ),
                compute,
            ),
        ]
        out.append(
            Draft(
                "filter_count",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                cells,
                f"Filtering {fname} on {col} {op} {num_text(thr)}{extra_text} leaves the number of rows below.",
                ("load", "filter", "count") + (("second condition",) if extra_text else ()),
                key=f"{col}{op}{thr}{extra_text}",
            )
        )
        retired_check_draws(out[-1], rng)
    return out


STATS = {
    "mean": ("mean", "the mean", "s.mean()", "np.mean(s)"),
    "median": ("median", "the median", "s.median()", "np.median(s)"),
    "std": (
        "sample standard deviation (ddof=1)",
        "the sample standard deviation",
        "s.std()",
        "np.std(s, ddof=1)",
    ),
    "min": ("minimum", "the minimum", "s.min()", "np.min(s)"),
    "max": ("maximum", "the maximum", "s.max()", "np.max(s)"),
    "range": ("range (maximum minus minimum)", "the range", "s.max() - s.min()", "np.ptp(s)"),
}


@register_family(
    "describe_stat", "verified", "a descriptive statistic of a column, optionally within a group", SINGLE
)
def describe_stat(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums, cats = ctx.numeric(), ctx.categorical()
    for _ in range(ctx.count):
        if not nums:
            break
        col = pick(rng, nums)
        stat = pick(rng, sorted(STATS))
        label, phrase, pandas_expr, numpy_expr = STATS[stat]
        sel, where = f"df[{q(col)}]", ""
        if cats and rng.random() < 0.4:
            cat = pick(rng, cats)
            level = pick_level(ctx, cat)
            sel = f"df.loc[df[{q(cat)}] == {level_text(level)}, {q(col)}]"
            where = f" among the rows with {cat} equal to {level}"
        decimals = decimals_for(ctx.frame[col])
        ws = single_ws(ctx)
        fname = ws.files[0]
        instruction = pick(
            rng,
            [
                f"What is the {label} of {col} in {fname}{where}, ignoring missing values? Round to {decimals} decimals.",
                f"Compute {phrase} of the column {col}{where} (file {fname}; skip missing values). Give the value rounded to {decimals} decimal places.",
                f"Using {fname}, report {phrase} of {col}{where}. Missing values are ignored; round the result to {decimals} decimals.",
            ],
        )
        answer = AnswerFormat("number", decimals)
        program = (
            f"{imports(ws)}\n{load_code(ws, rng)}\ns = {sel}.dropna()\nresult = float({pandas_expr})\n"
            + gate_line('{"answer": result, "n": int(len(s))}')
        )
        use_numpy = rng.random() < 0.4
        calc = f"s = {sel}.dropna()\nvalue = float({numpy_expr if use_numpy else pandas_expr})"
        head = imports(ws, "import numpy as np" if use_numpy else "")
        compute = f"{head}\n{load_code(ws, rng)}\n{calc}\nprint('values used:', len(s))\n{answer_print(answer, 'value')}"
        out.append(
            Draft(
                "describe_stat",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, f"{phrase} of {col}"),
                    Cell(f"I take the non-missing values of {col}{where} and compute {phrase}.", compute),
                ],
                f"I computed {phrase} of {col}{where} over the non-missing values.",
                ("load", stat) + (("filter",) if where else ()),
                key=f"{stat}:{col}{where}",
            )
        )
        retired_check_draws(out[-1], rng)
    return out


@register_family(
    "group_rank", "verified", "group with the highest/lowest mean, or top-k rows by a measure", SINGLE
)
def group_rank(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums, cats, label = ctx.numeric(), ctx.categorical(), ctx.spec.label
    if not nums or not (cats or label):
        return out
    for _ in range(ctx.count):
        col = pick(rng, nums)
        ws = single_ws(ctx)
        fname = ws.files[0]
        high = rng.random() < 0.65
        word = "highest" if high else "lowest"
        if label and (not cats or rng.random() < 0.5):
            k = pick(rng, [3, 5])
            instruction = (
                f"In {fname}, which {k} values of {label} have the {word} {col}? List them from the {word} down, "
                f"separated by commas (ignore rows where {col} is missing)."
            )
            answer = AnswerFormat("text")
            asc = "False" if high else "True"
            program = (
                f"{imports(ws)}\n{load_code(ws, rng)}\nd = df.dropna(subset=[{q(col)}]).sort_values({q(col)}, ascending={asc})\n"
                f"vals = d[{q(col)}].tolist()\ntop = d[{q(label)}].head({k}).tolist()\nresult = ', '.join(map(str, top))\n"
                f"gaps = [abs(vals[i] - vals[i + 1]) for i in range(min({k}, len(vals) - 1))]\n"
                + gate_line(
                    '{"answer": result, "n": len(vals), "margin": min(gaps) if len(vals) > '
                    + str(k)
                    + " else 0.0}"
                )
            )
            how = "nlargest" if high else "nsmallest"
            compute = (
                f"{imports(ws)}\n{load_code(ws, rng)}\n"
                + pick(
                    rng,
                    [
                        f"top = df.{how}({k}, {q(col)})\nprint(top[[{q(label)}, {q(col)}]].to_string())\nnames = top[{q(label)}].tolist()",
                        f"ranked = df.dropna(subset=[{q(col)}]).sort_values({q(col)}, ascending={asc})\nprint(ranked[[{q(label)}, {q(col)}]].head({k + 1}).to_string())\nnames = ranked[{q(label)}].head({k}).tolist()",
                    ],
                )
                + f"\nprint('{ANSWER}', ', '.join(map(str, names)))"
            )
            ops = ("load", "sort", "top-k")
            key = f"top{k}:{col}:{word}"
            what = f"the {k} {label} values with the {word} {col}"
        else:
            cat = pick(rng, cats)
            instruction = pick(
                rng,
                [
                    f"Using {fname}, which value of {cat} has the {word} average {col}? Answer with the {cat} value only.",
                    f"Group the rows of {fname} by {cat} and compute the mean {col} per group. Which group has the {word} mean? Give the {cat} value.",
                ],
            )
            answer = AnswerFormat("text")
            asc = "False" if high else "True"
            program = (
                f"{imports(ws)}\n{load_code(ws, rng)}\nm = df.groupby({q(cat)})[{q(col)}].mean().dropna().sort_values(ascending={asc})\n"
                "result = str(m.index[0])\n"
                + gate_line(
                    '{"answer": result, "n": len(m), "margin": abs(float(m.iloc[0]) - float(m.iloc[1])) if len(m) > 1 else 0.0}'
                )
            )
            pick_fn = "idxmax" if high else "idxmin"
            compute = (
                f"{imports(ws)}\n{load_code(ws, rng)}\n"
                + pick(
                    rng,
                    [
                        f"means = df.groupby({q(cat)})[{q(col)}].mean()\nprint(means.round(4).to_string())\nbest = means.{pick_fn}()",
                        f"means = df.pivot_table(index={q(cat)}, values={q(col)}, aggfunc='mean')[{q(col)}]\nprint(means.sort_values().round(4).to_string())\nbest = means.{pick_fn}()",
                    ],
                )
                + f"\nprint('{ANSWER}', best)"
            )
            ops = ("load", "group", "mean", "argmax")
            key = f"group:{cat}:{col}:{word}"
            what = f"the {cat} group with the {word} mean {col}"
        out.append(
            Draft(
                "group_rank",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [explore_cell(ws, rng, what), Cell(f"Now I rank to find {what}.", compute)],
                f"Ranking gives {what}.",
                ops,
                key=key,
            )
        )
    return out


ANSWER = "Final answer:"


@register_family("share_percent", "verified", "percentage of rows or of a total", SINGLE)
def share_percent(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums, cats = ctx.numeric(), ctx.categorical()
    for _ in range(ctx.count):
        if not nums:
            break
        ws = single_ws(ctx)
        fname = ws.files[0]
        answer = AnswerFormat("number", 2)
        mode = pick(rng, ["level", "total", "threshold"] if cats else ["threshold"])
        col = pick(rng, nums)
        if mode == "level":
            cat = pick(rng, cats)
            level = pick_level(ctx, cat)
            instruction = f"What percentage of the rows in {fname} have {cat} equal to {level}? Give a percentage between 0 and 100, rounded to 2 decimals."
            expr = f"(df[{q(cat)}] == {level_text(level)})"
            program_calc = f"hit = {expr}\nresult = 100.0 * hit.sum() / len(df)\nn = int(hit.sum())"
            calc = pick(
                rng,
                [
                    f"share = 100 * (df[{q(cat)}] == {level_text(level)}).mean()",
                    f"counts = df[{q(cat)}].value_counts()\nprint(counts.to_string())\nshare = 100 * counts[{level_text(level)}] / counts.sum()",
                ],
            )
            key, what = f"level:{cat}={level}", f"the share of rows with {cat} = {level}"
        elif mode == "total":
            cat = pick(rng, cats)
            level = pick_level(ctx, cat)
            instruction = (
                f"In {fname}, what share of the total {col} (summed over all rows, missing values ignored) comes from rows with "
                f"{cat} equal to {level}? Answer in percent, rounded to 2 decimals."
            )
            program_calc = f"part = df.loc[df[{q(cat)}] == {level_text(level)}, {q(col)}].sum()\nresult = 100.0 * part / df[{q(col)}].sum()\nn = int((df[{q(cat)}] == {level_text(level)}).sum())"
            calc = pick(
                rng,
                [
                    f"by_group = df.groupby({q(cat)})[{q(col)}].sum()\nprint(by_group.to_string())\nshare = 100 * by_group[{level_text(level)}] / by_group.sum()",
                    f"total = df[{q(col)}].sum()\npart = df[df[{q(cat)}] == {level_text(level)}][{q(col)}].sum()\nshare = part / total * 100",
                ],
            )
            key, what = f"total:{col}:{cat}={level}", f"the share of total {col} from {cat} = {level}"
        else:
            thr = nice_threshold(float(ctx.frame[col].quantile(pick(rng, [0.1, 0.3, 0.5, 0.7, 0.9]))))
            instruction = (
                f"Among the non-missing values of {col} in {fname}, what percentage is above {num_text(thr)}? "
                "Round to 2 decimals (a number between 0 and 100)."
            )
            program_calc = f"s = df[{q(col)}].dropna()\nresult = 100.0 * (s > {num_text(thr)}).sum() / len(s)\nn = int((s > {num_text(thr)}).sum())"
            calc = pick(
                rng,
                [
                    f"s = df[{q(col)}].dropna()\nshare = (s > {num_text(thr)}).mean() * 100",
                    f"valid = df[df[{q(col)}].notna()]\nshare = 100 * len(valid[valid[{q(col)}] > {num_text(thr)}]) / len(valid)",
                ],
            )
            key, what = f"thr:{col}>{thr}", f"the percentage of {col} values above {num_text(thr)}"
        program = f"{imports(ws)}\n{load_code(ws, rng)}\n{program_calc}\n" + gate_line(
            '{"answer": float(result), "n": n}'
        )
        compute = f"{imports(ws)}\n{load_code(ws, rng)}\n{calc}\n{answer_print(answer, 'share')}"
        out.append(
            Draft(
                "share_percent",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [explore_cell(ws, rng, what), Cell(f"I compute {what} as a percentage.", compute)],
                f"The percentage is {what}, computed over the rows described.",
                ("load", "filter", "ratio"),
                key=key,
            )
        )
        retired_check_draws(out[-1], rng)
    return out


@register_family("missing_quantile", "verified", "missing-value counts and quantiles", ("messy", "csv"))
def missing_quantile(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    natural = [c for c in ctx.spec.numeric if ctx.frame[c].isna().any()]
    options = []
    if natural and "csv" in ctx.workspaces:
        options += [(ctx.workspaces["csv"], c) for c in natural]
    if "messy" in ctx.workspaces:
        options += [
            (ctx.workspaces["messy"], c) for c in sorted(ctx.workspaces["messy"].injected["blank_cells"])
        ]
    if not options:
        return out
    for _ in range(ctx.count):
        ws, col = pick(rng, options)
        fname = ws.files[0]
        mode = pick(rng, ["count", "quantile", "both"])
        pct = pick(rng, [10, 25, 75, 90])
        decimals = decimals_for(ctx.frame[col])
        where = f"{fname} (all rows as they are in the file)"
        if mode == "count":
            answer = AnswerFormat("integer")
            instruction = (
                f"How many missing values does the column {col} have in {where}? Answer with an integer."
            )
            program_calc = f"result = int(df[{q(col)}].isna().sum())\nn = result"
            payload = '{"answer": result, "n": n}'
            calc, exprs = (
                pick(
                    rng, [f"missing = df[{q(col)}].isna().sum()", f"missing = len(df) - df[{q(col)}].count()"]
                ),
                "missing",
            )
        elif mode == "quantile":
            answer = AnswerFormat("number", decimals)
            instruction = (
                f"What is the {pct}th percentile of {col} in {where}, ignoring missing values and using pandas' default "
                f"linear interpolation? Round to {decimals} decimals."
            )
            program_calc = (
                f"result = float(df[{q(col)}].quantile({pct / 100}))\nn = int(df[{q(col)}].notna().sum())"
            )
            payload = '{"answer": result, "n": n}'
            calc = pick(
                rng,
                [
                    f"value = df[{q(col)}].quantile({pct / 100})",
                    f"value = df[{q(col)}].dropna().quantile(q={pct / 100})",
                ],
            )
            exprs = "value"
        else:
            answer = AnswerFormat(
                "parts", parts=(Part("missing", "integer"), Part("median", "number", decimals))
            )
            instruction = (
                f"For the column {col} in {where}: how many values are missing, and what is the median of the rest? "
                f"Answer as @missing[count] @median[value] with the median rounded to {decimals} decimals."
            )
            program_calc = (
                f"miss = int(df[{q(col)}].isna().sum())\nmed = float(df[{q(col)}].median())\nn = miss"
            )
            payload = '{"answer": {"missing": miss, "median": med}, "n": n}'
            calc = f"missing = int(df[{q(col)}].isna().sum())\nmedian = df[{q(col)}].median()"
            exprs = {"missing": "missing", "median": "median"}
        program = f"{imports(ws)}\n{load_code(ws, rng)}\n{program_calc}\n" + gate_line(payload)
        compute = f"{imports(ws)}\n{load_code(ws, rng)}\n{calc}\nprint('rows:', len(df))\n{answer_print(answer, exprs)}"
        out.append(
            Draft(
                "missing_quantile",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, f"the missing values and spread of {col}"),
                    Cell(f"I compute what is asked for {col}, leaving the rows as they are.", compute),
                ],
                f"These figures describe {col} in {fname} as given.",
                ("load", "missing") + (("quantile",) if mode != "count" else ()),
                key=f"{mode}:{col}:{pct}:{ws.kind}",
            )
        )
    return out
