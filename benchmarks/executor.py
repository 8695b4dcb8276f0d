"""Executor benchmark: what a code cell costs through ``DeepAnalyzeEnv.step``, against per-cell processes.

Why this exists: upstream DeepAnalyze starts one ``multiprocessing.Process`` per cell, and under
SkyRL (which forces the ``spawn`` start method) that costs hundreds of milliseconds per cell, so
rollouts spend their time starting interpreters rather than running the policy's code. This env
instead forks one worker per *episode* from a preloaded fork server and sends cells to it over a
pipe; the worker runs each cell in a child it forked in advance (docs/design.md §12). This
script measures, in one run on one machine:

1. the per-cell overhead of ``env.step`` for a ``print(1)`` cell (median, p90, p99), back to
   back and 20 ms apart (as generation spaces a turn's cells), and what one process per cell
   costs in a worker of the preloaded stack (its ``fork()``, its exit until reaped);
2. baseline A: one ``spawn`` Process per cell, the child exec'ing ``print(1)`` with stdout
   captured and sent back through a pipe (what upstream does under SkyRL);
3. baseline B: the same under ``fork``, from a parent that has pandas imported;
4. the ratios of (1) to (2) and (3);
5. episode start (env construction + ``init``) with the fork server already warm, and the
   one-time cold start (server included) separately;
6. the USS of an idle episode worker, right after ``init`` and after one cell;
7. a realistic cell (imports, ``read_csv`` of a shipped file, groupby, print) through ``env.step``.

Usage: ``python benchmarks/executor.py [--cells N] [--json OUT]``.

Keep the module's top-level imports to the standard library: the ``spawn`` baseline re-imports
this module in every child, and heavy imports here would inflate that baseline unfairly.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORKSPACE_ID = "retail"
PRINT_CELL = "<Code>\n```python\nprint(1)\n```\n</Code>"
REALISTIC_CODE = (
    "import pandas as pd, seaborn as sns, sklearn\n"
    "df = pd.read_csv('sales.csv')\n"
    "df['revenue'] = df['units'] * df['unit_price']\n"
    "print(df.groupby('category')['revenue'].agg(['count', 'sum', 'mean']).round(2))\n"
)
REALISTIC_CELL = f"<Code>\n```python\n{REALISTIC_CODE}```\n</Code>"

TARGET_STEP_MS = 0.5
TARGET_SPACED_STEP_MS = 1.0
STEP_GAP_S = 0.02
TARGET_FORK_RATIO = 20.0
TARGET_SPAWN_RATIO = 500.0
TARGET_EPISODE_START_MS = 30.0
TARGET_IDLE_USS_MB = 20.0

VERSIONED = (
    "deepanalyze-env",
    "skyrl-gym",
    "pandas",
    "numpy",
    "scipy",
    "matplotlib",
    "seaborn",
    "scikit-learn",
    "statsmodels",
    "psutil",
)


# ----------------------------------------------------------------------------- helpers


def ms_stats(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000.0 for s in samples_s)
    p90_index = max(0, math.ceil(0.9 * len(ms)) - 1)  # nearest rank
    p99_index = max(0, math.ceil(0.99 * len(ms)) - 1)
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": ms[p90_index],
        "p99_ms": ms[p99_index],
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


def child_exec(code: str, conn: Any) -> None:
    """Per-cell baseline child: exec the cell with stdout captured, send the text back."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    conn.send(buf.getvalue())
    conn.close()


def per_cell_process(method: str, samples: int, warmup: int) -> dict[str, float]:
    """One Process per cell under ``method``: start, exec ``print(1)``, receive output, join."""
    ctx = multiprocessing.get_context(method)
    times: list[float] = []
    for i in range(warmup + samples):
        start = time.perf_counter()
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=child_exec, args=("print(1)", send))
        proc.start()
        send.close()
        out = recv.recv()
        proc.join()
        recv.close()
        elapsed = time.perf_counter() - start
        if out != "1\n":
            raise RuntimeError(f"{method} baseline child returned {out!r}")
        if i >= warmup:
            times.append(elapsed)
    return ms_stats(times)


def make_workspace_root() -> tuple[Path, Path | None]:
    """The shipped data folder, or a temporary stand-in with a sales.csv when it is missing."""
    shipped = REPO / "data"
    if (shipped / "workspaces" / WORKSPACE_ID / "sales.csv").is_file():
        return shipped, None
    tmp = Path(tempfile.mkdtemp(prefix="executor-bench-"))
    ws = tmp / "workspaces" / WORKSPACE_ID
    ws.mkdir(parents=True)
    rows = ["order_id,order_date,store_id,category,units,unit_price,payment_method"]
    cats = ("Grocery", "Household", "Toys", "Apparel")
    for i in range(120):
        rows.append(
            f"{10001 + i},2024-01-{i % 28 + 1:02d},S0{i % 6 + 1},{cats[i % 4]},"
            f"{i % 5 + 1},{4.99 + i % 7},card"
        )
    (ws / "sales.csv").write_text("\n".join(rows) + "\n")
    return tmp, tmp


def make_env(workspace_root: Path):
    import skyrl_gym

    import deepanalyze_env  # noqa: F401  (registers "deepanalyze")

    return skyrl_gym.make(
        "deepanalyze",
        env_config={"workspace_root": str(workspace_root)},
        extras={
            "reward_spec": {"method": "datatask", "ground_truth": "1", "function": ["qa_accuracy"]},
            "data": "workspaces",
            "workspace_id": WORKSPACE_ID,
            "input_seq": "q",
            "max_turns": 100000,
        },
    )


def start_episode(workspace_root: Path):
    env = make_env(workspace_root)
    env.init([{"role": "user", "content": "x"}])
    if env.kernel is None or env.kernel.pid is None:
        raise RuntimeError(f"episode did not start: {env._infra_error}")
    return env


def checked_step(env, action: str, expect: str | None = None):
    out = env.step(action)
    meta = out["metadata"]
    if out["done"] or meta["exec"]["status"] != "ok":
        raise RuntimeError(f"step failed: {out}")
    if expect is not None and expect not in out["observations"][0]["content"]:
        raise RuntimeError(f"unexpected observation: {out['observations'][0]['content']!r}")
    return out


# ----------------------------------------------------------------------------- measurements


def measure_env(workspace_root: Path, cells: int, episodes: int, realistic: int) -> dict[str, Any]:
    import psutil

    results: dict[str, Any] = {}

    # Cold start: the first episode in this process also starts the preloaded fork server.
    start = time.perf_counter()
    env = start_episode(workspace_root)
    results["cold_episode_start_ms"] = (time.perf_counter() - start) * 1000.0
    env.close()

    # 5. Episode start with a warm server (construction + init), closing each.
    starts: list[float] = []
    closes: list[float] = []
    for _ in range(3 + episodes):
        t0 = time.perf_counter()
        env = start_episode(workspace_root)
        t1 = time.perf_counter()
        env.close()
        t2 = time.perf_counter()
        starts.append(t1 - t0)
        closes.append(t2 - t1)
    results["episode_start"] = ms_stats(starts[3:])
    results["episode_close"] = ms_stats(closes[3:])
    # In training an episode's generation separates episode starts: the server has forked its
    # spare worker by then, so starting only hands the spare its connection.
    spaced: list[float] = []
    for _ in range(episodes):
        time.sleep(0.1)
        t0 = time.perf_counter()
        env = start_episode(workspace_root)
        spaced.append(time.perf_counter() - t0)
        env.close()
    results["episode_start_spaced"] = ms_stats(spaced)
    results.update(episode_start_parts(workspace_root, episodes))

    # 6. + 1. One episode: idle USS, then print(1) cells.
    env = start_episode(workspace_root)
    time.sleep(0.2)  # let the worker settle (it is idle, blocked on its control socket)
    worker = psutil.Process(env.kernel.pid)
    mem0 = worker.memory_full_info()
    checked_step(env, PRINT_CELL, expect="1")
    time.sleep(0.05)
    mem1 = worker.memory_full_info()
    results["idle_uss_after_init_mb"] = mem0.uss / 2**20
    results["idle_uss_after_cell_mb"] = mem1.uss / 2**20
    results["idle_rss_after_cell_mb"] = mem1.rss / 2**20
    results["idle_pss_after_cell_mb"] = mem1.pss / 2**20

    for _ in range(30):
        checked_step(env, PRINT_CELL)
    step_times: list[float] = []
    kernel_times: list[float] = []
    for _ in range(cells):
        t0 = time.perf_counter()
        out = env.step(PRINT_CELL)
        step_times.append(time.perf_counter() - t0)
        kernel_times.append(out["metadata"]["exec"]["elapsed_ms"] / 1000.0)
        if out["metadata"]["exec"]["status"] != "ok":
            raise RuntimeError(f"print(1) cell failed: {out}")
    results["step_print"] = ms_stats(step_times)
    results["kernel_run_print"] = ms_stats(kernel_times)
    # In training a turn's generation separates a cell from the next: the worker has its next
    # cell's process forked by then. Steps 20 ms apart model that (generation takes far longer).
    spaced_steps: list[float] = []
    for _ in range(cells):
        time.sleep(STEP_GAP_S)
        t0 = time.perf_counter()
        out = env.step(PRINT_CELL)
        spaced_steps.append(time.perf_counter() - t0)
        if out["metadata"]["exec"]["status"] != "ok":
            raise RuntimeError(f"print(1) cell failed: {out}")
    results["step_print_spaced"] = ms_stats(spaced_steps)
    if env.kernel.restarts:
        raise RuntimeError("the worker restarted during the print(1) loop")

    # 7. Realistic cell in the same (warm) worker; the first run is reported separately.
    t0 = time.perf_counter()
    first = checked_step(env, REALISTIC_CELL, expect="Grocery")
    results["realistic_first_ms"] = (time.perf_counter() - t0) * 1000.0
    results["realistic_output"] = first["observations"][0]["content"]
    real_times: list[float] = []
    for _ in range(realistic):
        t0 = time.perf_counter()
        checked_step(env, REALISTIC_CELL)
        real_times.append(time.perf_counter() - t0)
    results["step_realistic"] = ms_stats(real_times)
    spaced_real: list[float] = []
    for _ in range(realistic):
        time.sleep(STEP_GAP_S)
        t0 = time.perf_counter()
        checked_step(env, REALISTIC_CELL)
        spaced_real.append(time.perf_counter() - t0)
    results["step_realistic_spaced"] = ms_stats(spaced_real)
    env.close()
    return results


def episode_start_parts(workspace_root: Path, samples: int) -> dict[str, Any]:
    """Where episode start goes: the scratch copy of the workspace, and the worker fork alone."""
    from tools.kernel import Kernel
    from tools.workspace import Workspace

    source = workspace_root / "workspaces" / WORKSPACE_ID
    copies: list[float] = []
    forks: list[float] = []
    for _ in range(samples):
        t0 = time.perf_counter()
        ws = Workspace(source)
        t1 = time.perf_counter()
        kernel = Kernel(ws.path)  # connect, the server forks, the worker says hello
        t2 = time.perf_counter()
        kernel.close()
        ws.remove()
        copies.append(t1 - t0)
        forks.append(t2 - t1)
    return {"workspace_copy": ms_stats(copies), "worker_fork": ms_stats(forks)}


CELL_PROCESS_PROBE = """
import gc, importlib, os, sys, time
import matplotlib
matplotlib.use("Agg")
for name in sys.argv[1:]:
    importlib.import_module(name)
gc.collect()
gc.freeze()
forks, ends = [], []
if os.fork() == 0:  # a worker: a fork of the preloaded process, as the fork server makes them
    for _ in range(60):
        r, w = os.pipe()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.read(r, 1)
            os._exit(0)
        t1 = time.perf_counter()
        os.write(w, b"x")
        os.waitpid(pid, 0)
        t2 = time.perf_counter()
        os.close(r)
        os.close(w)
        forks.append(t1 - t0)
        ends.append(t2 - t1)
    print(repr((forks[10:], ends[10:])))
    sys.stdout.flush()
    os._exit(0)
os.wait()
"""


def measure_cell_process() -> dict[str, Any]:
    """What one process per cell costs in a worker of the preloaded stack: ``fork()`` of the
    worker (page tables of its anonymous memory), and the child's exit until it is reaped (the
    same memory torn down), with the kernel stack imported as the fork server imports it."""
    import ast
    import subprocess

    from tools.fork_server import DEFAULT_PRELOAD

    done = subprocess.run(
        [sys.executable, "-c", CELL_PROCESS_PROBE, *DEFAULT_PRELOAD],
        capture_output=True,
        text=True,
        check=True,
    )
    forks, ends = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    return {"cell_fork": ms_stats(forks), "cell_exit_reap": ms_stats(ends)}


def measure_server_start() -> float:
    """A fresh fork server (a second one, not the env's cached one): its one-time start cost."""
    from tools.fork_server import DEFAULT_PRELOAD, KernelServer

    start = time.perf_counter()
    server = KernelServer(sys.executable, DEFAULT_PRELOAD)
    elapsed = (time.perf_counter() - start) * 1000.0
    server.shutdown()
    return elapsed


# ----------------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 2**20, 1)
    versions = {}
    for dist in VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": ram_gib,
        "python": platform.python_version(),
        "packages": versions,
    }


def build_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    step = r["step_print"]["median_ms"]
    fork = r["fork_per_cell"]["median_ms"]
    spawn = r["spawn_per_cell"]["median_ms"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    return [
        (
            "env.step print(1) median",
            f"{step:.3f} ms",
            f"<= {TARGET_STEP_MS} ms",
            verdict(step <= TARGET_STEP_MS),
        ),
        (
            "env.step print(1) p90 / p99",
            f"{r['step_print']['p90_ms']:.3f} / {r['step_print']['p99_ms']:.3f} ms",
            "",
            "",
        ),
        (
            "env.step print(1), 20 ms apart, median",
            f"{r['step_print_spaced']['median_ms']:.3f} ms",
            f"<= {TARGET_SPACED_STEP_MS} ms",
            verdict(r["step_print_spaced"]["median_ms"] <= TARGET_SPACED_STEP_MS),
        ),
        ("env.step print(1), 20 ms apart, p99", f"{r['step_print_spaced']['p99_ms']:.3f} ms", "", ""),
        ("fork of a worker (per-cell process) median", f"{r['cell_fork']['median_ms']:.2f} ms", "", ""),
        ("its exit until reaped, median", f"{r['cell_exit_reap']['median_ms']:.2f} ms", "", ""),
        ("  of which kernel.run median", f"{r['kernel_run_print']['median_ms']:.3f} ms", "", ""),
        ("fork per cell median (pandas parent)", f"{fork:.2f} ms", "", ""),
        ("spawn per cell median", f"{spawn:.1f} ms", "", ""),
        (
            "fork-per-cell / step",
            f"{fork / step:.0f}x",
            f">= {TARGET_FORK_RATIO:.0f}x",
            verdict(fork / step >= TARGET_FORK_RATIO),
        ),
        (
            "spawn-per-cell / step",
            f"{spawn / step:.0f}x",
            f">= {TARGET_SPAWN_RATIO:.0f}x",
            verdict(spawn / step >= TARGET_SPAWN_RATIO),
        ),
        (
            "episode start (make + init) median",
            f"{r['episode_start']['median_ms']:.2f} ms",
            f"<= {TARGET_EPISODE_START_MS:.0f} ms",
            verdict(r["episode_start"]["median_ms"] <= TARGET_EPISODE_START_MS),
        ),
        ("episode start p90", f"{r['episode_start']['p90_ms']:.2f} ms", "", ""),
        (
            "episode start, 100 ms apart, median",
            f"{r['episode_start_spaced']['median_ms']:.2f} ms",
            "<= 30 ms",
            verdict(r["episode_start_spaced"]["median_ms"] <= 30.0),
        ),
        ("  worker fork alone (Kernel()) median", f"{r['worker_fork']['median_ms']:.2f} ms", "", ""),
        ("  workspace copy alone median", f"{r['workspace_copy']['median_ms']:.2f} ms", "", ""),
        ("episode close median", f"{r['episode_close']['median_ms']:.2f} ms", "", ""),
        ("cold first episode (server start incl.)", f"{r['cold_episode_start_ms']:.0f} ms", "one-time", ""),
        ("fork server start (fresh)", f"{r['server_start_ms']:.0f} ms", "one-time", ""),
        (
            "idle worker USS after init",
            f"{r['idle_uss_after_init_mb']:.1f} MB",
            f"<= {TARGET_IDLE_USS_MB:.0f} MB",
            verdict(r["idle_uss_after_init_mb"] <= TARGET_IDLE_USS_MB),
        ),
        (
            "idle worker USS after print(1)",
            f"{r['idle_uss_after_cell_mb']:.1f} MB",
            f"<= {TARGET_IDLE_USS_MB:.0f} MB",
            verdict(r["idle_uss_after_cell_mb"] <= TARGET_IDLE_USS_MB),
        ),
        (
            "  (RSS / PSS after print(1))",
            f"{r['idle_rss_after_cell_mb']:.0f} / {r['idle_pss_after_cell_mb']:.1f} MB",
            "",
            "",
        ),
        ("realistic cell median (warm worker)", f"{r['step_realistic']['median_ms']:.2f} ms", "", ""),
        ("realistic cell, first in the worker", f"{r['realistic_first_ms']:.2f} ms", "", ""),
        ("realistic cell, 20 ms apart, median", f"{r['step_realistic_spaced']['median_ms']:.2f} ms", "", ""),
    ]


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(title="Executor benchmark")
    for col in ("metric", "value", "target", "result"):
        table.add_column(col)
    for metric, value, target, verdict in rows:
        style = {"PASS": "green", "FAIL": "bold red"}.get(verdict, "")
        table.add_row(metric, value, target, f"[{style}]{verdict}[/]" if style else verdict)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300, help="print(1) cells timed through env.step")
    parser.add_argument("--episodes", type=int, default=30, help="episodes timed for episode start")
    parser.add_argument("--spawn-samples", type=int, default=20, help="spawn-per-cell samples")
    parser.add_argument("--fork-samples", type=int, default=100, help="fork-per-cell samples")
    parser.add_argument("--realistic", type=int, default=20, help="realistic-cell samples")
    parser.add_argument("--json", type=Path, help="write all numbers to this JSON file")
    args = parser.parse_args(argv)

    results: dict[str, Any] = {"machine": machine_info(), "argv": sys.argv}

    # Baselines first, while this process is still light (no threads, no server child).
    print("baseline A: spawn per cell ...", flush=True)
    results["spawn_per_cell"] = per_cell_process("spawn", args.spawn_samples, warmup=2)
    import pandas  # noqa: F401  (baseline B forks from a parent that has pandas imported)

    print("baseline B: fork per cell (pandas imported) ...", flush=True)
    results["fork_per_cell"] = per_cell_process("fork", args.fork_samples, warmup=5)

    workspace_root, tmp = make_workspace_root()
    results["workspace_root"] = str(workspace_root) if tmp is None else "temporary stand-in"
    try:
        print("env: episodes, cells, memory ...", flush=True)
        results.update(measure_env(workspace_root, args.cells, args.episodes, args.realistic))
        print("per-cell process: fork and exit of a worker ...", flush=True)
        results.update(measure_cell_process())
        print("fork server: fresh start ...", flush=True)
        results["server_start_ms"] = measure_server_start()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    step = results["step_print"]["median_ms"]
    results["ratio_fork_over_step"] = results["fork_per_cell"]["median_ms"] / step
    results["ratio_spawn_over_step"] = results["spawn_per_cell"]["median_ms"] / step
    rows = build_rows(results)
    results["table"] = [dict(zip(("metric", "value", "target", "result"), row, strict=True)) for row in rows]
    print_table(rows)
    print("realistic cell observation:", results["realistic_output"].strip().replace("\n", "\n  "))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(row[3] == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
