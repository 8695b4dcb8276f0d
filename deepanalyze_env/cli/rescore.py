"""``deepanalyze-rl rescore DIR``: recompute judge components after a judge outage (and the
components a reward function failed to compute, once it is fixed); a judge is needed only
when a chosen episode's plan has judge components.

Writes ``DIR/rescored-<timestamp>.jsonl`` holding the updated records (with provenance under
``rescore``); the original files are never edited. ``stats`` and later ``rescore`` runs read
the run with the newest re-score of each episode laid over it, so running ``rescore`` again
retries exactly the episodes that are still ``verifier_error``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from deepanalyze_env.cli.common import (
    SubParsers,
    UsageError,
    add_shared_flags,
    console,
    load_env_config,
    make_parser,
)
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.offline.report import progress_bar

if TYPE_CHECKING:
    from deepanalyze_env.core.config import JudgeConfig
    from deepanalyze_env.offline.rescore import Rescored, RescoreSkip
    from rewards.judge import JudgeClient


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "rescore",
        "recompute judge components (and missing ones) of recorded episodes, e.g. after a judge outage",
        "deepanalyze-rl rescore runs/teacher --judge-base-url http://127.0.0.1:8001/v1 --judge-model judge",
    )
    p.add_argument("run", metavar="DIR", help="run folder (rollout --out, train output_dir or a records_dir)")
    p.add_argument(
        "--all", action="store_true", help="re-score every scored episode too, not only verifier_error ones"
    )
    p.add_argument(
        "--concurrency", type=int, default=16, metavar="N", help="episodes re-scored at once (default 16)"
    )
    add_shared_flags(p)
    p.set_defaults(func=cmd_rescore)


def _output_path(run: Path) -> Path:
    """``rescored-<UTC time to the microsecond>.jsonl``: fixed width, so name order is time order
    (``load_run`` lays re-scores over the run in name order)."""
    while True:
        now = datetime.now(UTC)
        path = run / f"rescored-{now:%Y%m%dT%H%M%S.%f}Z.jsonl"
        if not path.exists():
            return path
        time.sleep(0.001)


def judge_client(config: JudgeConfig, functions: list[str]) -> JudgeClient:
    """The shared judge client; a bad setting or a missing prompt file is a one-line error now."""
    from rewards.judge import JudgeError, get_judge_client, validate_prompts
    from rewards.judges import rubrics_for

    try:
        client = get_judge_client(config)
        validate_prompts(client.settings.prompt_dir, rubrics_for(functions))
    except (JudgeError, ValueError, OSError) as exc:
        raise UsageError(str(exc))
    return client


def cmd_rescore(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.core.records import load_run, write_jsonl_atomic
    from deepanalyze_env.offline.rescore import RescoreSkip, judge_functions, rescore_record, selectable

    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise UsageError(f"no such run folder: {run_dir}")
    if args.concurrency < 1:
        raise UsageError("--concurrency must be >= 1")
    config = EnvConfig.from_any(load_env_config(args))
    try:
        run = load_run(run_dir)
    except ValueError as exc:
        raise UsageError(str(exc))
    if not run.records:
        raise UsageError(f"{run_dir} holds no episode records")
    chosen = [r for r in run.records if selectable(r, args.all)]
    if not chosen:
        console.print(f"nothing to re-score: no {'scored or ' if args.all else ''}verifier_error episodes")
        return 0
    needed = judge_functions(chosen)
    if needed and not config.judge.configured:
        raise UsageError(
            f"these episodes' reward plans need a judge ({', '.join(needed)}): "
            "give --judge-base-url and --judge-model (or judge: in --config)"
        )
    client = judge_client(config.judge, needed) if needed else None
    out = _output_path(run_dir)
    source = ", ".join(str(p) for p in run.sources)

    def one(record: JsonObject) -> Rescored | RescoreSkip:
        try:
            return rescore_record(record, client, source=source)
        except RescoreSkip as exc:
            return exc

    results: list[Rescored | RescoreSkip] = []
    with (
        progress_bar("rescore", total=len(chosen), console=console) as (progress, bar),
        ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="rescore") as pool,
    ):
        for result in pool.map(one, chosen):
            results.append(result)
            counts = Counter(r.after for r in results if not isinstance(r, RescoreSkip))
            progress.update(bar, advance=1, info=", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    updated = [r for r in results if not isinstance(r, RescoreSkip)]
    skipped = [r for r in results if isinstance(r, RescoreSkip)]
    if updated:
        write_jsonl_atomic(out, [r.record for r in updated])
    fixed = sum(1 for r in updated if r.before != "scored" and r.after == "scored")
    still = sum(1 for r in updated if r.after == "verifier_error")
    console.print(
        f"re-scored {len(updated)} episodes: {fixed} now scored, {still} still verifier_error"
        + (f", {len(skipped)} skipped ({skipped[0]})" if skipped else ""),
        highlight=False,
    )
    if updated:
        console.print(
            f"written: {out} (originals untouched; stats and rescore read it over them)", highlight=False
        )
    if still:
        first = next(r for r in updated if r.after == "verifier_error")
        console.print(f"[yellow]first remaining error[/yellow]: {first.record.get('error')}", highlight=False)
    return 1 if still else 0
