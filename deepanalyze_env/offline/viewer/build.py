"""Write a run's episodes as one self-contained HTML page (``deepanalyze-rl view``).

The page is the template beside this module with the stylesheet, the script and the data
inlined. It loads nothing: a Content-Security-Policy allows exactly the one inline script and
the one inline style (by their sha256), no connections, images, fonts, frames or forms — so
even a bug that let policy text become markup could neither run code nor reach the network.
Data sits in ``<script type="application/json">`` elements, which browsers never execute:
the index first (the run page renders from it while the bodies below are still parsing),
then one element per episode body, parsed only when that episode is opened.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from deepanalyze_env.core.contracts import EpisodeRecord
from deepanalyze_env.core.filters import RecordFilter
from deepanalyze_env.core.records import load_run, read_records
from deepanalyze_env.offline.rundir import KEPT_FILE, MANIFEST
from deepanalyze_env.offline.stats import ComponentMean, compute_stats, summary_rows
from deepanalyze_env.offline.viewer.highlight import CLASSES
from deepanalyze_env.offline.viewer.payload import INDEX_COLUMNS, Payload, script_json, suspect_of

HERE = Path(__file__).resolve().parent
HISTOGRAM_BINS = 20
STEP_METRICS = "metrics.jsonl"  # a GRPO output folder's per-step lines (trainers/trl/train.py: step_line)
_PLACEHOLDER = re.compile(r"\{\{[A-Z]+\}\}")


class ViewError(ValueError):
    """The run cannot be shown; the message says why."""


@dataclass
class ViewReport:
    """What ``view`` wrote (path, episodes, size against the records' size), for the command's summary
    and the size test."""

    path: Path
    episodes: int
    bytes: int
    record_bytes: int  # size of the records shown, as JSON lines (the page's size yardstick)
    kept_source: str | None
    fixed_bytes: int = 0  # the page itself (template, style, script), whatever the run's size

    @property
    def ratio(self) -> float:
        """Bytes of the page's episode data per byte of records."""
        return (self.bytes - self.fixed_bytes) / self.record_bytes if self.record_bytes else 0.0


def _kept_ids(
    run: Path, records: Sequence[EpisodeRecord], keep: str | None
) -> tuple[set[str] | None, str | None]:
    """Which episodes count as kept: ``--keep`` if given, else the run's kept.jsonl, else its
    manifest's ``keep`` expression; ``None`` when the run says nothing about keeping."""
    if keep:
        flt = RecordFilter(keep)
        return {str(r.get("episode_id")) for r in records if flt(r)}, f"--keep {keep}"
    if run.is_dir() and (run / KEPT_FILE).is_file():
        return {str(r.get("episode_id")) for r in read_records(run / KEPT_FILE)}, KEPT_FILE
    manifest = run / MANIFEST if run.is_dir() else None
    if manifest is not None and manifest.is_file():
        expr = json.loads(manifest.read_text()).get("keep")
        if expr:
            flt = RecordFilter(expr)
            return {str(r.get("episode_id")) for r in records if flt(r)}, f"run keep: {expr}"
    return None, None


class Histogram(TypedDict):
    """The scored rewards binned: ``HISTOGRAM_BINS`` counts between their edges (empty when none)."""

    edges: list[float]
    counts: list[int]


class StepExclusions(TypedDict):
    """One training step's ``verifier_error`` rate by cause, as its ``metrics.jsonl`` line says."""

    source: int  # index into ``sources``
    step: int
    rates: dict[str, float]  # reward_error_cause → share of the step's episodes


def step_exclusions(sources: Sequence[Path]) -> list[StepExclusions]:
    """Per training step, the ``verifier_error`` rate by cause of each source that is a GRPO output
    folder (its ``metrics.jsonl``; computed there by ``core.contracts.verifier_error_rates``), so a
    policy learning to be excluded shows as a rising line. Lines written before the rates existed,
    and unreadable ones, are skipped; a source without the file gives none."""
    steps: list[StepExclusions] = []
    for s, source in enumerate(sources):
        path = source / STEP_METRICS
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            rates = item.get("verifier_error_rates") if isinstance(item, dict) else None
            if isinstance(rates, dict) and isinstance(item.get("step"), int):
                clean = {str(k): float(v) for k, v in rates.items() if isinstance(v, int | float)}
                steps.append({"source": s, "step": item["step"], "rates": clean})
    return steps


class PageMeta(TypedDict):
    """The page's summary data (``{{META}}``): sources, the stats rows and counts, the histogram."""

    title: str
    sources: list[str]
    generated: str
    kept_source: str | None
    duplicates: int
    summary: list[tuple[str, str]]
    components: dict[str, ComponentMean]
    status_counts: dict[str, int]
    verifier_error_rates: dict[str, float]  # reward_error_cause → share of the shown episodes
    steps: list[StepExclusions]  # per training step, when a source is a GRPO output folder
    termination_counts: dict[str, int]
    episodes: int
    suspects: int
    histogram: Histogram
    highlight_classes: list[str]


def reward_histogram(records: Sequence[EpisodeRecord]) -> Histogram:
    rewards = [float(r["reward"]) for r in records if r.get("reward_status") == "scored"]
    if not rewards:
        return {"edges": [], "counts": []}
    lo, hi = min(rewards), max(rewards)
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(rewards, bins=HISTOGRAM_BINS, range=(lo, hi))
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def render_page(title: str, meta: PageMeta, payload: Payload) -> str:
    """The HTML text: template + inlined css/js + data elements."""
    template = (HERE / "template.html").read_text(encoding="utf-8")
    css = (HERE / "viewer.css").read_text(encoding="utf-8")
    js = (HERE / "viewer.js").read_text(encoding="utf-8")
    csp = (
        "default-src 'none'; "
        f"script-src {_csp_hash(js)}; "
        f"style-src {_csp_hash(css)}; "
        "img-src 'none'; font-src 'none'; connect-src 'none'; media-src 'none'; object-src 'none'; "
        "frame-src 'none'; worker-src 'none'; manifest-src 'none'; base-uri 'none'; form-action 'none'"
    )
    bodies = "\n".join(
        f'<script type="application/json" id="b{i}">{body}</script>' for i, body in enumerate(payload.bodies)
    )
    index = {"columns": list(INDEX_COLUMNS), "rows": payload.index, "shared": payload.shared}
    replacements = {
        "{{CSP}}": html.escape(csp, quote=True),
        "{{TITLE}}": html.escape(title),
        "{{CSS}}": css,
        "{{JS}}": js,
        "{{META}}": script_json(meta),
        "{{INDEX}}": script_json(index),
        "{{BODIES}}": bodies,
    }
    # one pass: a value is never scanned for placeholders, so data cannot inject one
    return _PLACEHOLDER.sub(lambda m: replacements[m.group(0)], template)


def build_view(
    sources: Sequence[str | Path],
    out: str | Path,
    *,
    keep: str | None = None,
    rescored: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> ViewReport:
    """Load the runs in ``sources`` and write the page to ``out``.

    ``progress(done, total)`` is called as episodes are laid out (lexing code cells is the slow
    part), so the command can show a bar on long runs. Episodes the reward-hacking watch flags
    (``core/hacking.py``) come first, each group in run order: they are what to read first.
    """
    payload = Payload()
    all_records: list[EpisodeRecord] = []
    source_names: list[str] = []
    kept_sources: list[str] = []
    record_bytes = 0
    seen: set[str] = set()
    duplicates = 0
    runs = [(Path(source), load_run(Path(source), rescored=rescored)) for source in sources]
    shown: list[tuple[EpisodeRecord, bool | None, int, list[str]]] = []
    for s, (path, run) in enumerate(runs):
        kept, kept_source = _kept_ids(path, run.records, keep)
        if kept_source:
            kept_sources.append(kept_source)
        source_names.append(str(path))
        for record in run.records:
            eid = str(record.get("episode_id"))
            if eid in seen:
                duplicates += 1
                continue
            seen.add(eid)
            all_records.append(record)
            record_bytes += (
                len(json.dumps(record, ensure_ascii=False, default=str).encode("utf-8", "replace")) + 1
            )
            shown.append((record, None if kept is None else eid in kept, s, suspect_of(record)))
    shown.sort(key=lambda item: not item[3])  # stable: suspects first, each group in run order
    for done, (record, kept_flag, s, suspect) in enumerate(shown, 1):
        if progress is not None and (done % 100 == 0 or done == len(shown)):
            progress(done, len(shown))
        payload.add(record, kept=kept_flag, source=s, suspect=suspect)
    if not all_records:
        raise ViewError(f"{', '.join(map(str, sources))}: no episode records")
    stats = compute_stats(all_records)
    meta: PageMeta = {
        "title": ", ".join(source_names),
        "sources": source_names,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "kept_source": "; ".join(sorted(set(kept_sources))) or None,
        "duplicates": duplicates,
        "summary": summary_rows(stats),
        "components": stats["components"],
        "status_counts": stats["status_counts"],
        "verifier_error_rates": stats["verifier_error_rates"],
        "steps": step_exclusions([path for path, _ in runs]),
        "termination_counts": stats["termination_counts"],
        "episodes": stats["episodes"],
        "suspects": sum(1 for item in shown if item[3]),
        "histogram": reward_histogram(all_records),
        "highlight_classes": list(CLASSES),
    }
    page = render_page(f"episodes: {meta['title']}", meta, payload)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    fixed = sum(len((HERE / name).read_bytes()) for name in ("template.html", "viewer.css", "viewer.js"))
    return ViewReport(out, len(all_records), out.stat().st_size, record_bytes, meta["kept_source"], fixed)
