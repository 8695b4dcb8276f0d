"""Statistical families: correlations, OLS regression, hypothesis tests (answers in ``@name[value]`` parts)."""

from __future__ import annotations

import re

from deepanalyze_env.offline.bank.families.base import (
    ANSWER_MARK,
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
    pick,
    q,
    register_family,
    retired_check_draws,
)
from deepanalyze_env.offline.bank.families.basic import SINGLE, level_text, single_ws


def safe(name: str) -> str:
    return re.sub(r"\W+", "_", str(name)).strip("_").lower() or "x"


@register_family("correlation", "verified", "Pearson/Spearman correlation, strongest correlate", SINGLE)
def correlation(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums = ctx.numeric()
    if len(nums) < 2:
        return out
    for _ in range(ctx.count):
        ws = single_ws(ctx)
        fname = ws.files[0]
        a, b = rng.sample(nums, 2)
        mode = pick(rng, ["parts", "spearman", "strongest"] if len(nums) >= 4 else ["parts", "spearman"])
        if mode == "parts":
            answer = AnswerFormat(
                "parts", parts=(Part("correlation", "number", 3), Part("direction", "text"))
            )
            instruction = pick(
                rng,
                [
                    f"In {fname}, compute the Pearson correlation between {a} and {b} (rows with a missing value in either "
                    "column are left out) and say whether the relationship is positive or negative. Answer as "
                    "@correlation[value] @direction[positive or negative], the correlation rounded to 3 decimals.",
                    f"How are {a} and {b} related in {fname}? Give their Pearson correlation over the complete rows and its "
                    "sign, as @correlation[value] @direction[positive or negative] (correlation to 3 decimals).",
                ],
            )
            program_calc = f"d = df[[{q(a)}, {q(b)}]].dropna()\nr = float(d[{q(a)}].corr(d[{q(b)}]))\n"
            payload = '{"answer": {"correlation": r, "direction": "positive" if r > 0 else "negative"}, "n": len(d), "margin": abs(r)}'
            calc = pick(
                rng,
                [
                    f"d = df[[{q(a)}, {q(b)}]].dropna()\nr = d.corr().loc[{q(a)}, {q(b)}]",
                    f"from scipy import stats\nd = df[[{q(a)}, {q(b)}]].dropna()\nr, p = stats.pearsonr(d[{q(a)}], d[{q(b)}])",
                ],
            )
            calc += "\ndirection = 'positive' if r > 0 else 'negative'"
            exprs = {"correlation": "r", "direction": "direction"}
            ops, key = ("load", "dropna", "correlation"), f"pearson:{a}:{b}"
        elif mode == "spearman":
            answer = AnswerFormat("number", 3)
            instruction = (
                f"What is the Spearman rank correlation between {a} and {b} in {fname}, over the rows where both are "
                "present? Round to 3 decimals."
            )
            program_calc = f"d = df[[{q(a)}, {q(b)}]].dropna()\nr = float(d[{q(a)}].corr(d[{q(b)}], method='spearman'))\n"
            payload = '{"answer": r, "n": len(d)}'
            calc = pick(
                rng,
                [
                    f"d = df[[{q(a)}, {q(b)}]].dropna()\nr = d[{q(a)}].corr(d[{q(b)}], method='spearman')",
                    f"from scipy.stats import spearmanr\nd = df[[{q(a)}, {q(b)}]].dropna()\nr = spearmanr(d[{q(a)}], d[{q(b)}]).statistic",
                ],
            )
            exprs = "r"
            ops, key = ("load", "dropna", "rank correlation"), f"spearman:{a}:{b}"
        else:
            cands = rng.sample([c for c in nums if c != a], 3)
            listed = ", ".join(cands)
            answer = AnswerFormat("text")
            instruction = (
                f"Which of the columns {listed} has the strongest Pearson correlation (largest absolute value) with {a} "
                f"in {fname}? Use pairwise complete rows. Answer with the column name."
            )
            program_calc = (
                f"c = df[[{q(a)}] + {cands!r}].corr()[{q(a)}].drop({q(a)}).abs().sort_values(ascending=False)\n"
                "r = str(c.index[0])\n"
            )
            payload = '{"answer": r, "n": len(df), "margin": float(c.iloc[0] - c.iloc[1])}'
            calc = f"corr = df[{cands!r}].corrwith(df[{q(a)}])\nprint(corr.round(4).to_string())\nbest = corr.abs().idxmax()"
            exprs = None
            ops, key = ("load", "correlation matrix", "argmax"), f"strongest:{a}:{listed}"
        program = f"{imports(ws)}\n{load_code(ws, rng)}\n{program_calc}" + gate_line(payload)
        final = f"print('{ANSWER_MARK}', best)" if exprs is None else answer_print(answer, exprs)
        compute = f"{imports(ws)}\n{load_code(ws, rng)}\n{calc}\n{final}"
        out.append(
            Draft(
                "correlation",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, f"the correlation of {a}"),
                    Cell("I compute the correlation on the complete rows.", compute),
                ],
                "The correlation was computed on the rows where the columns are present.",
                ops,
                key=key,
            )
        )
        retired_check_draws(out[-1], rng)
    return out


@register_family("ols", "verified", "OLS regression coefficients and R² (statsmodels)", SINGLE)
def ols(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums = ctx.numeric()
    if len(nums) < 2:
        return out
    for _ in range(ctx.count):
        ws = single_ws(ctx)
        fname = ws.files[0]
        y = pick(rng, nums)
        xs = rng.sample([c for c in nums if c != y], 2 if len(nums) >= 3 and rng.random() < 0.4 else 1)
        sy = float(ctx.frame[y].std())
        parts = []
        for x in xs:
            sx = float(ctx.frame[x].std()) or 1.0
            parts.append(Part(f"coef_{safe(x)}", "number", decimals_for([sy / sx], base=3)))
        parts.append(Part("r_squared", "number", 3))
        answer = AnswerFormat("parts", parts=tuple(parts))
        x_list = ", ".join(xs)
        fmt = " ".join(f"@{p.name}[value]" for p in parts)
        rounding = "; ".join(f"{p.name} to {p.decimals} decimals" for p in parts)
        instruction = pick(
            rng,
            [
                f"Using {fname}, fit an ordinary least squares regression of {y} on {x_list} with an intercept "
                f"(drop rows with a missing value in these columns). Report the slope coefficient(s) and R². "
                f"Answer as {fmt}, rounded: {rounding}.",
                f"Regress {y} on {x_list} by OLS with a constant term, using the complete rows of {fname}. "
                f"What are the estimated slope(s) and the R² of the fit? Reply as {fmt} ({rounding}).",
                f"How well does {x_list} explain {y} in {fname}? Fit a linear model {y} ~ {x_list} (OLS, with an "
                f"intercept, rows with missing values dropped) and give {fmt}, rounded: {rounding}.",
            ],
        )
        cols = [y, *xs]
        program = (
            f"{imports(ws, 'import statsmodels.api as sm')}\n{load_code(ws, rng)}\nd = df[{cols!r}].dropna()\n"
            f"fit = sm.OLS(d[{q(y)}], sm.add_constant(d[{xs!r}])).fit()\n"
            "ans = {"
            + ", ".join(f"{p.name!r}: float(fit.params[{x!r}])" for p, x in zip(parts, xs, strict=False))
            + ", 'r_squared': float(fit.rsquared)}\n"
            + gate_line('{"answer": ans, "n": len(d)}')
        )
        if len(xs) == 1 and rng.random() < 0.5:
            calc = (
                f"from scipy import stats\nd = df[{cols!r}].dropna()\nres = stats.linregress(d[{q(xs[0])}], d[{q(y)}])\n"
                "print(res)\nslope, r2 = res.slope, res.rvalue ** 2"
            )
            exprs = {parts[0].name: "slope", "r_squared": "r2"}
            head = imports(ws)
        else:
            calc = (
                f"d = df[{cols!r}].dropna()\nmodel = sm.OLS(d[{q(y)}], sm.add_constant(d[{xs!r}])).fit()\n"
                "print(model.params.round(6).to_string())\nprint('R2', round(model.rsquared, 6))\nr2 = model.rsquared"
            )
            exprs = {p.name: f"model.params[{x!r}]" for p, x in zip(parts, xs, strict=False)} | {
                "r_squared": "r2"
            }
            head = imports(ws, "import statsmodels.api as sm")
        compute = f"{head}\n{load_code(ws, rng)}\n{calc}\n{answer_print(answer, exprs)}"
        out.append(
            Draft(
                "ols",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, f"a regression of {y} on {x_list}"),
                    Cell(f"I fit {y} ~ {x_list} with an intercept on the complete rows.", compute),
                ],
                f"The OLS fit of {y} on {x_list} gives these coefficients and R².",
                ("load", "dropna", "ols") + (("multiple regression",) if len(xs) > 1 else ()),
                key=f"ols:{y}~{x_list}",
            )
        )
        retired_check_draws(out[-1], rng)
    return out


@register_family("hypothesis_test", "verified", "Welch t-test or chi-square test decision at 0.05", SINGLE)
def hypothesis_test(ctx: FamilyContext) -> list[Draft]:
    rng, out = ctx.rng, []
    nums, cats = ctx.numeric(), ctx.categorical(max_levels=8)
    if not nums:
        return out
    for _ in range(ctx.count):
        ws = single_ws(ctx)
        fname = ws.files[0]
        mode = pick(rng, ["ttest", "ttest", "chi2"] if len(cats) >= 2 else ["ttest"])
        parts = (Part("p_value", "number", 4), Part("decision", "text"))
        if mode == "ttest":
            col = pick(rng, nums)
            if cats and rng.random() < 0.7:
                cat = pick(rng, cats)
                levels = sorted(ctx.frame[cat].dropna().unique().tolist(), key=str)
                l1, l2 = rng.sample(levels, 2)
                g1, g2 = (
                    f"df.loc[df[{q(cat)}] == {level_text(l1)}, {q(col)}].dropna()",
                    f"df.loc[df[{q(cat)}] == {level_text(l2)}, {q(col)}].dropna()",
                )
                groups = f"rows with {cat} = {l1} and rows with {cat} = {l2}"
                key = f"t:{col}:{cat}:{l1}:{l2}"
            else:
                other = pick(rng, [c for c in nums if c != col] or nums)
                g1 = f"df.loc[df[{q(other)}] > df[{q(other)}].median(), {q(col)}].dropna()"
                g2 = f"df.loc[df[{q(other)}] <= df[{q(other)}].median(), {q(col)}].dropna()"
                groups = f"rows whose {other} is above its median and the other rows (at or below the median)"
                key = f"t:{col}:median:{other}"
            instruction = pick(
                rng,
                [
                    f"Using {fname}, test whether the mean of {col} differs between {groups} with Welch's two-sample t-test "
                    "(unequal variances, two-sided; missing values dropped). At the 0.05 level, do you reject the null "
                    "hypothesis of equal means? Answer as @p_value[value] @decision[reject or fail to reject], the p-value "
                    "rounded to 4 decimals.",
                    f"Is the average {col} different for {groups} in {fname}? Run a two-sided Welch t-test (scipy's "
                    "ttest_ind with equal_var=False, missing values dropped) and decide at alpha = 0.05. Reply as "
                    "@p_value[value] @decision[reject or fail to reject] with the p-value to 4 decimals.",
                ],
            )
            program_calc = f"from scipy import stats\na = {g1}\nb = {g2}\np = float(stats.ttest_ind(a, b, equal_var=False).pvalue)\nn = min(len(a), len(b))"
            calc = f"from scipy import stats\na = {g1}\nb = {g2}\nprint(len(a), len(b), round(a.mean(), 4), round(b.mean(), 4))\nres = stats.ttest_ind(a, b, equal_var=False)\nprint(res)\np = res.pvalue"
            ops = ("load", "split groups", "t-test", "decision")
        else:
            c1, c2 = rng.sample(cats, 2)
            instruction = pick(
                rng,
                [
                    f"Is {c1} independent of {c2} in {fname}? Run a chi-square test of independence on their contingency "
                    "table (scipy.stats.chi2_contingency with its defaults) and decide at the 0.05 level. Answer as "
                    "@p_value[value] @decision[reject or fail to reject], the p-value rounded to 4 decimals.",
                    f"Cross-tabulate {c1} against {c2} in {fname} and test for an association with a chi-square test "
                    "(scipy.stats.chi2_contingency, default settings). Using alpha = 0.05, give @p_value[value] "
                    "@decision[reject or fail to reject], the p-value to 4 decimals.",
                ],
            )
            program_calc = (
                f"from scipy import stats\ntab = pd.crosstab(df[{q(c1)}], df[{q(c2)}])\np = float(stats.chi2_contingency(tab)[1])\n"
                "n = int(tab.values.min() >= 0) * int(tab.shape[0] > 1 and tab.shape[1] > 1) * int(tab.values.sum())"
            )
            calc = f"from scipy.stats import chi2_contingency\ntable = pd.crosstab(df[{q(c1)}], df[{q(c2)}])\nprint(table.to_string())\nchi2, p, dof, expected = chi2_contingency(table)\nprint('chi2', round(chi2, 4), 'dof', dof)"
            key = f"chi2:{c1}:{c2}"
            ops = ("load", "crosstab", "chi-square", "decision")
        answer = AnswerFormat("parts", parts=parts)
        program = f"{imports(ws)}\n{load_code(ws, rng)}\n{program_calc}\n" + gate_line(
            '{"answer": {"p_value": p, "decision": "reject" if p < 0.05 else "fail to reject"}, "n": n, "alpha_gap": abs(p - 0.05)}'
        )
        compute = (
            f"{imports(ws)}\n{load_code(ws, rng)}\n{calc}\ndecision = 'reject' if p < 0.05 else 'fail to reject'\n"
            + answer_print(answer, {"p_value": "p", "decision": "decision"})
        )
        out.append(
            Draft(
                "hypothesis_test",
                ctx.spec.name,
                ws,
                instruction,
                answer,
                program,
                [
                    explore_cell(ws, rng, "the test"),
                    Cell("I run the test as specified and compare the p-value with 0.05.", compute),
                ],
                "The test's p-value against the 0.05 level decides.",
                ops,
                key=key,
            )
        )
    return out
