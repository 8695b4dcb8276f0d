"""Helpers shared by every workspace module: exact-number formatting (refusing rounding ties),
byte-stable CSV/JSONL writers, and the builders of assistant turns in the tag protocol.
"""

from __future__ import annotations

import csv
import io
import json
import textwrap
from fractions import Fraction
from pathlib import Path


def rounded(value: Fraction, digits: int) -> float:
    """Round an exact value to ``digits`` decimals, refusing values close to a rounding tie.

    Pandas computes the same quantities in floating point; away from a tie the tiny float error
    cannot change the rounded digits, so the generator and the trajectories' printed output agree.
    """
    scaled = Fraction(value) * 10**digits
    frac = scaled - (scaled.numerator // scaled.denominator)
    if abs(frac - Fraction(1, 2)) < Fraction(1, 10**6):
        raise AssertionError(f"{float(value)!r} is too close to a rounding tie at {digits} digits")
    return float(round(Fraction(value), digits))


def f2(value: Fraction) -> str:
    return f"{rounded(value, 2):.2f}"


def f1(value: Fraction) -> str:
    return f"{rounded(value, 1):.1f}"


def float_fmt(value: float, digits: int) -> str:
    """Format a float computed with libm-free arithmetic, refusing near-ties."""
    scaled = abs(value) * 10**digits
    if abs(scaled - int(scaled) - 0.5) < 1e-6:
        raise AssertionError(f"{value!r} is too close to a rounding tie at {digits} digits")
    return f"{value:.{digits}f}"


def mean(values) -> Fraction:
    values = list(values)
    return Fraction(sum(values), len(values))


def cents(value: int) -> str:
    return f"{value // 100}.{value % 100:02d}"


def tenths(value: int) -> str:
    sign = "-" if value < 0 else ""
    value = abs(value)
    return f"{sign}{value // 10}.{value % 10}"


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_bytes(path, buf.getvalue().encode("utf-8"))


def write_jsonl(path: Path, records: list[dict]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    write_bytes(path, text.encode("utf-8"))


def code(src: str) -> str:
    return textwrap.dedent(src).strip("\n")


def text(src: str) -> str:
    """Dedent prose and unwrap its hard line breaks, as a model writes it: paragraphs and
    ``- `` bullets stay on one line each; blank lines and the final ``Answer:`` line are kept."""
    out: list[str] = []
    for line in textwrap.dedent(src).strip("\n").splitlines():
        stripped = line.strip()
        if not stripped:
            out.append("")
        elif out and out[-1] and not stripped.startswith(("- ", "Answer:")):
            out[-1] += " " + stripped
        else:
            out.append(stripped)
    return "\n".join(out)


def turn(analyze=None, code_src=None, answer=None, understand=None, fence=True, prose=None):
    """One assistant action in the DeepAnalyze tag protocol."""
    parts = []
    if understand:
        parts.append(f"<Understand>\n{text(understand)}\n</Understand>")
    if analyze:
        parts.append(f"<Analyze>\n{text(analyze)}\n</Analyze>")
    if prose:  # untagged reasoning, as a policy that forgot the tags would write it
        parts.append(text(prose))
    if code_src is not None:
        body = code(code_src)
        if fence:
            body = f"```python\n{body}\n```"
        parts.append(f"<Code>\n{body}\n</Code>")
    if answer is not None:
        parts.append(f"<Answer>\n{text(answer)}\n</Answer>")
    return "\n".join(parts)
