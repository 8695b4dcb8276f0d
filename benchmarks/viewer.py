"""Viewer benchmark: does a 10,000-episode page open and filter in under a second?

Why this exists: ``deepanalyze-rl view`` promises a run of 10,000 episodes opens and filters in
under a second in a browser, with a file whose size per episode stays near the record's. This
measures both, in the same headless Chromium the tests use (Debian's ``chromium`` through
Playwright), on a synthetic run built from real records: the scripted policy runs every shipped
task (good and bad trajectories) against a local judge once, then those records are cloned
into ``--episodes`` episodes (groups of ``--group`` samples per task, ids, rewards and statuses
varied, every text kept), written as one records file, and turned into a page.

Measured: page build time and size (bytes per episode vs the record's JSON line); in the
browser, when the table is on screen (``ready_at_ms``: since navigation start, what "opens"
means), first contentful paint, DOMContentLoaded (all bodies parsed), and the in-page time of
a status filter, a reward-range filter, a text search, a full-text search over every body, a
sort by reward, and opening an episode page; each browser number is the median of
``--repeat`` page loads.

Usage: ``python benchmarks/viewer.py [--episodes 10000] [--group 8] [--repeat 3] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deepanalyze_env.cli import main as cli  # noqa: E402
from deepanalyze_env.core.records import load_run, write_jsonl_atomic  # noqa: E402
from deepanalyze_env.offline.viewer import build_view  # noqa: E402
from rewards.judge.fake_server import FakeJudgeServer, Reply  # noqa: E402

VERDICT = (
    '```json\n{"usefulness": 5, "richness": 4, "soundness": 4, "interpretability": 3, "readability": 5}\n```'
)


def real_records(work: Path) -> list[dict[str, Any]]:
    """Every shipped task, good and bad, through ``rollout`` with a local judge."""
    out = work / "seed-run"
    with FakeJudgeServer() as judge:
        judge.script(Reply(text="Weaknesses:\n- none\nSCORE: 4"), match="reviewing the working process")
        judge.script(Reply(text="Weaknesses:\n- rounding\nSCORE: 5"), match="reference answer")
        judge.script(Reply(text="Weaknesses:\n- short\n" + VERDICT))
        args = ["rollout", "--out", str(out), "--run-id", "seed", "--concurrency", "2"]
        if cli([*args, "--judge-base-url", judge.url, "--judge-model", "judge-m"]) != 0:
            raise SystemExit("the seed rollout failed")
    return load_run(out).records


def synthetic(seed: list[dict[str, Any]], n: int, group: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        base = seed[i % len(seed)]
        record = json.loads(json.dumps(base))
        task = i // group
        record["episode_id"] = f"bench-t{task:05d}-s{i % group:03d}"
        record["task_id"] = f"{base['task_id']}-{task:05d}"
        roll = rng.random()
        if roll < 0.05:
            record["reward_status"], record["error"] = "verifier_error", "judge_analysis: JudgeTimeout: 60 s"
        elif roll < 0.07:
            record["reward_status"], record["error"] = "environment_error", "worker died while idle"
        elif record["reward_status"] == "scored":
            record["reward"] = round(rng.uniform(-1, 1), 3)
        out.append(record)
    return out


def interact(page: Any, episode: int) -> dict[str, float]:
    """Filter, search, sort and open an episode on a loaded page; in-page milliseconds each."""

    def timed(action: Any) -> float:
        action()
        return page.evaluate("window.viewerTimings.last_filter_ms")

    m = {"filter_status_ms": timed(lambda: page.select_option("select[name=status]", "verifier_error"))}
    page.select_option("select[name=status]", "")
    m["filter_reward_ms"] = timed(lambda: page.fill("input[name=rmin]", "0.5"))
    page.fill("input[name=rmin]", "")
    m["search_index_ms"] = timed(lambda: page.fill("input[name=q]", "retail"))
    page.check("input[name=full]")
    m["search_full_first_ms"] = timed(lambda: page.fill("input[name=q]", "groupby"))
    m["search_full_again_ms"] = timed(lambda: page.fill("input[name=q]", "idxmax"))
    page.uncheck("input[name=full]")
    page.fill("input[name=q]", "")
    start = time.perf_counter()
    page.click("th[data-key=reward] button")
    m["sort_reward_wall_ms"] = (time.perf_counter() - start) * 1000
    page.evaluate("n => { location.hash = '#/e/' + n; }", episode)
    page.wait_for_selector("#episode-view:not([hidden]) article.episode")
    m["open_episode_ms"] = page.evaluate("window.viewerTimings.last_episode_ms")
    return m


def chromium() -> str:
    exe = (
        os.environ.get("DEEPANALYZE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not exe:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    return exe


def measure_browser(page_path: Path, repeat: int, episodes: int) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    exe = chromium()
    episode = min(4321, episodes - 1)
    runs: list[dict[str, float]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        for _ in range(repeat):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            wall = time.perf_counter()
            page.goto(page_path.resolve().as_uri(), wait_until="commit")
            page.wait_for_selector("body[data-ready='1']")
            wall_ready = (time.perf_counter() - wall) * 1000
            page.wait_for_load_state("domcontentloaded")
            m: dict[str, float] = {"wall_ready_ms": wall_ready}
            timings = page.evaluate("window.viewerTimings")
            m["ready_at_ms"] = timings["ready_at_ms"]
            m["script_ms"] = timings["first_render_ms"]
            m["fcp_ms"] = page.evaluate(
                "(performance.getEntriesByName('first-contentful-paint')[0] || {startTime: NaN}).startTime"
            )
            m["dom_content_loaded_ms"] = page.evaluate(
                "performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"
            )

            m.update(interact(page, episode))
            runs.append(m)
            page.close()
        browser.close()
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--group", type=int, default=8, help="samples per task")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        seed = real_records(work)
        records = synthetic(seed, args.episodes, args.group)
        source = work / "records.jsonl"
        write_jsonl_atomic(source, records)
        start = time.perf_counter()
        report = build_view([source], work / "page.html")
        build_s = time.perf_counter() - start
        result: dict[str, Any] = {
            "episodes": report.episodes,
            "seed_records": len(seed),
            "build_s": build_s,
            "page_bytes": report.bytes,
            "records_bytes": source.stat().st_size,
            "bytes_per_episode": report.bytes / report.episodes,
            "record_bytes_per_episode": source.stat().st_size / report.episodes,
            "size_ratio": report.bytes / source.stat().st_size,
        }
        result.update(measure_browser(work / "page.html", args.repeat, report.episodes))
    result["machine"] = f"{platform.platform()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}"
    for key, value in result.items():
        print(f"{key:28s} {value:.1f}" if isinstance(value, float) else f"{key:28s} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
