"""Open-ended families: data cleaning that writes a file (``datatask``) and report prompts (``openresearch``)."""

from __future__ import annotations

from deepanalyze_env.offline.bank.families.base import (
    ANSWER_MARK,
    AnswerFormat,
    Cell,
    Draft,
    FamilyContext,
    explore_cell,
    gate_line,
    load_code,
    pick,
    q,
    register_family,
)

MAX_CLEAN_ROWS = 1000  # the reference output travels inline in reward_spec


@register_family(
    "cleaning", "datatask", "clean a messy file and save it (file compared with the reference)", ("messy",)
)
def cleaning(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    ws = ctx.workspaces.get("messy")
    if ws is None or len(ctx.frame) > MAX_CLEAN_ROWS:
        return out
    raw = ws.files[0]
    target = raw.replace("_raw.csv", "_clean.csv")
    blanks = sorted(ws.injected["blank_cells"])
    for _ in range(ctx.count):
        drop_col = pick(rng, blanks)
        fill_col = next((c for c in blanks if c != drop_col), None) if rng.random() < 0.7 else None
        fill_how = pick(rng, ["median", "mean"])
        steps = [
            "remove exact duplicate rows (keep the first occurrence)",
            f"drop the rows where {drop_col} is missing",
        ]
        ops = ["load", "drop duplicates", "drop missing"]
        code_steps = ["df = df.drop_duplicates(keep='first')", f"df = df.dropna(subset=[{q(drop_col)}])"]
        alt_steps = ["df = df[~df.duplicated()]", f"df = df[df[{q(drop_col)}].notna()]"]
        if fill_col:
            steps.append(
                f"fill the missing values of {fill_col} with the {fill_how} of {fill_col} computed after the previous steps"
            )
            code_steps.append(f"df[{q(fill_col)}] = df[{q(fill_col)}].fillna(df[{q(fill_col)}].{fill_how}())")
            alt_steps.append(
                f"value = df[{q(fill_col)}].{fill_how}()\ndf.loc[df[{q(fill_col)}].isna(), {q(fill_col)}] = value"
            )
            ops.append("impute")
        keep = (
            f"Keep all columns in their original order and the remaining rows in their original order, and save the "
            f"result as {target} (comma-separated, header row, no index column)."
        )
        todo = "; then ".join(steps)
        instruction = pick(
            rng,
            [
                f"Clean {raw}: {todo}. {keep} Report how many rows the cleaned file has. Answer with that integer.",
                f"{raw} has duplicated rows and missing values. Prepare a clean copy: {todo}. {keep} How many rows "
                "does the cleaned file have? Answer with an integer.",
            ],
        )
        answer = AnswerFormat("integer", file=target)
        body = "\n".join(code_steps)
        program = (
            f"import pandas as pd\ndf = pd.read_csv({raw!r})\n{body}\ndf.to_csv({target!r}, index=False)\n"
            f"back = pd.read_csv({target!r})\n"
            "rows = [[None if pd.isna(v) else (v.item() if hasattr(v, 'item') else v) for v in r] for r in back.itertuples(index=False)]\n"
            + gate_line(
                '{"answer": len(back), "n": len(back), "file": {"name": '
                + repr(target)
                + ', "columns": list(back.columns), "rows": rows}}'
            )
        )
        use_alt = rng.random() < 0.5
        compute = (
            f"import pandas as pd\n{load_code(ws, rng)}\nbefore = len(df)\n{chr(10).join(alt_steps if use_alt else code_steps)}\n"
            f"df.to_csv({target!r}, index=False)\nprint('rows before:', before, 'after:', len(df))\n"
            f"print('missing left:', int(df.isna().sum().sum()))"
        )
        check = f"import pandas as pd\nclean = pd.read_csv({target!r})\nprint(clean.shape)\nprint(clean.isna().sum().to_string())\nprint('{ANSWER_MARK}', len(clean))"
        out.append(
            Draft(
                "cleaning",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, "the cleaning"),
                    Cell(
                        "I apply the cleaning steps in the order given and write the file without the index.",
                        compute,
                    ),
                    Cell(f"I read {target} back to check that it was written as intended.", check),
                ],
                f"I removed duplicates, dropped rows with a missing {drop_col}"
                + (f", filled {fill_col} with its {fill_how}" if fill_col else "")
                + f" and saved {target}.",
                (*ops, "write file"),
                method="datatask",
                key=f"clean:{drop_col}:{fill_col}:{fill_how if fill_col else ''}",
            )
        )
    return out


@register_family(
    "report", "openresearch", "an open analytical report (judged by the rubric)", ("csv", "xlsx", "json")
)
def report(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums, cats = ctx.numeric(), ctx.categorical()
    if len(nums) < 2:
        return out
    from deepanalyze_env.offline.bank.families.basic import single_ws

    for _ in range(ctx.count):
        ws = single_ws(ctx)
        fname = ws.files[0]
        y = pick(rng, nums)
        others = [c for c in nums if c != y][:4]
        cat = pick(rng, cats) if cats and rng.random() < 0.6 else None
        focus = f"what is associated with {y}" + (f" and how it differs across {cat}" if cat else "")
        instruction = pick(
            rng,
            [
                f"Explore {fname} and write a short analytical report on {focus}. Support the findings with numbers and save at least one figure as a PNG file.",
                f"Analyse the data in {fname}: describe {y}, examine {focus}, and write a concise report with key figures. Save a chart to a PNG file.",
            ],
        )
        group_code = (
            f"g = df.groupby({q(cat)})[{q(y)}].agg(['count', 'mean']).round(3)\n"
            f"lines.append('- mean {y} by {cat}: ' + '; '.join(f'{{k}}: {{v}}' for k, v in g['mean'].items()))\n"
            if cat
            else ""
        )
        compute = (
            f"import pandas as pd\n{'import json' + chr(10) if ws.kind == 'json' else ''}{load_code(ws, rng)}\n"
            f"s = df[{q(y)}].dropna()\ncorr = df[{others!r}].corrwith(df[{q(y)}]).sort_values(key=abs, ascending=False)\n"
            "lines = []\n"
            f"lines.append(f'- {y}: n={{len(s)}}, mean={{s.mean():.3f}}, median={{s.median():.3f}}, sd={{s.std():.3f}}, range {{s.min():.3f}} to {{s.max():.3f}}')\n"
            f"lines.append('- correlations with {y}: ' + ', '.join(f'{{k}} {{v:.3f}}' for k, v in corr.items()))\n"
            f"{group_code}"
            f"strongest = corr.index[0]\nlines.append(f'- strongest linear association: {{strongest}} (r = {{corr.iloc[0]:.3f}})')\n"
            f"print('{ANSWER_MARK}')\nprint('\\n'.join(lines))"
        )
        figure = (
            f"import pandas as pd\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n{'import json' + chr(10) if ws.kind == 'json' else ''}{load_code(ws, rng)}\n"
            f"corr = df[{others!r}].corrwith(df[{q(y)}]).abs().sort_values(ascending=False)\nx = corr.index[0]\n"
            f"fig, ax = plt.subplots(figsize=(5, 4))\nax.scatter(df[x], df[{q(y)}], s=10)\nax.set_xlabel(x)\nax.set_ylabel({q(y)})\n"
            f"fig.tight_layout()\nfig.savefig('figure_{ctx.spec.name}.png')\nprint('saved figure_{ctx.spec.name}.png, x =', x)"
        )
        program = f"import pandas as pd\nimport json\n{load_code(ws, rng)}\n" + gate_line(
            f'{{"answer": None, "n": int(df[{q(y)}].notna().sum())}}'
        )
        cells = [
            explore_cell(ws, rng, f"a report on {y}"),
            Cell(
                f"I summarise {y}, its correlations with the other measures"
                + (f" and its mean per {cat}" if cat else "")
                + ".",
                compute,
            ),
            Cell(
                "A scatter plot against the most correlated measure supports the main finding; I save it as a PNG.",
                figure,
            ),
        ]
        out.append(
            Draft(
                "report",
                ctx.spec.name,
                ws,
                instruction,
                AnswerFormat("report"),
                program,
                cells,
                f"Report on {y} in {fname}. The key figures from the analysis:",
                ("load", "describe", "correlate", "plot") + (("group",) if cat else ()),
                method="openresearch",
                key=f"report:{y}:{cat}",
            )
        )
    return out
