"""``deepanalyze-rl collect``: outside agents play the tasks; the env scores and records them.

For each planned episode (tasks × samples, ids as in ``rollout``) one agent process runs. It
gets, in its environment and as ``{placeholders}`` in its command line:

- ``DEEPANALYZE_MCP_URL`` / ``{mcp_url}``: an MCP (streamable HTTP) URL bound to its one episode;
- ``OPENAI_BASE_URL`` / ``{openai_base_url}``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``: the recording
  proxy in front of the user's model endpoint (when ``--upstream-base-url`` is given); the key is
  a per-episode token, never the user's key;
- ``DEEPANALYZE_TASK_ID`` / ``{task_id}``, ``DEEPANALYZE_EPISODE_ID`` / ``{episode_id}``.

The reward is born in the env: the agent's ``submit_answer`` ends the episode and the env's
reward plan scores it; the agent's own exit code or output never does. The record is an ordinary
record (``policy_id`` ``black-box:NAME``) with ``agent`` holding the command, exit code, the
proxy's model calls and the tail of its output. How an episode ends:

- ``submit_answer`` (or the turn limit): recorded, scored;
- the agent exits or times out first: recorded as ``unfinished`` with the reason (a failed episode
  of that agent, counted as such by reports);
- the agent never opened its episode, or its model endpoint failed (the proxy saw a 5xx or no
  answer): not recorded, reported as an ``agent_error``; ``--resume`` runs it again.

The folder is a run folder with an eval report (``report.md``), so ``eval --compare``, ``view``,
``stats``, ``export`` and SFT (``kept.jsonl`` via ``--keep``) read it as any other.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import secrets
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.records import RecordWriter, build_record
from deepanalyze_env.offline.rollout import EpisodeJob, EpisodeOutcome
from deepanalyze_env.serve.hub import SessionHub, check_servable
from deepanalyze_env.serve.mcp_server import Assignment, EpisodeServer, http_app
from deepanalyze_env.serve.proxy import ProxyTrace, RecordingProxy, Upstream
from deepanalyze_env.serve.session import EpisodeSession, ServeError, ServeLimits
from deepanalyze_env.serve.stopping import WAIT_STEP_S, sigterm_as_interrupt

if TYPE_CHECKING:
    from rich.console import Console
    from starlette.requests import Request

    from deepanalyze_env.core.filters import RecordFilter
    from deepanalyze_env.offline.eval_schema import EvalReport
    from deepanalyze_env.offline.rundir import RunDir

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 8192


@dataclass(frozen=True)
class AgentSpec:
    """How to run the outside agent."""

    command: str
    """The command line (split like a shell would, no shell); ``{mcp_url}``, ``{openai_base_url}``,
    ``{task_id}``, ``{episode_id}`` are replaced per episode."""
    timeout_s: float = 600.0
    """Wall-clock seconds per episode; then the agent's process group is killed."""
    upstream: Upstream | None = None
    """The model endpoint behind the recording proxy; None: the agent calls no model through us."""
    cwd: str | None = None

    @property
    def name(self) -> str:
        parts = shlex.split(self.command)
        tail = [p for p in parts[1:] if not p.startswith("-")]
        main = Path(tail[0]).stem if parts and Path(parts[0]).name.startswith("python") and tail else None
        return main or (Path(parts[0]).name if parts else "agent")

    @property
    def policy_id(self) -> str:
        return f"black-box:{self.name}"


@dataclass
class _Slot:
    job: EpisodeJob
    claimed: bool = False


@dataclass
class Collector:
    """The MCP server and the proxy for one ``collect`` run, and the per-episode agent runs."""

    spec: AgentSpec
    env_config: JsonObject
    records_dir: Path
    limits: ServeLimits = field(default_factory=ServeLimits)

    def __post_init__(self) -> None:
        from deepanalyze_env.serve.http import BackgroundServer

        config = {k: v for k, v in self.env_config.items() if k != "records_dir"}  # we write the records
        self.hub = SessionHub(config, self.limits)
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._left: dict[str, EpisodeSession] = {}  # episodes whose client ended its session first
        self._procs: set[subprocess.Popen] = set()
        self.stopping = threading.Event()  # Ctrl-C: agents killed, their episodes left for --resume
        self.hub.listeners.append(
            lambda key, session: self._left.__setitem__(str(session.episode_id), session)
        )
        self.episodes = EpisodeServer(self.hub, self._assign)
        self.proxy = RecordingProxy(self.spec.upstream) if self.spec.upstream is not None else None
        routes = self.proxy.routes() if self.proxy is not None else None
        self.server = BackgroundServer(http_app(self.episodes, host="127.0.0.1", extra_routes=routes)).start()
        self.writer = RecordWriter.for_dir(self.records_dir)

    def _assign(self, request: Request | None) -> Assignment:
        """The handshake of an agent's session claims its episode (once: a second session with the
        same URL is refused at its handshake)."""
        token = request.query_params.get("episode") if request is not None else None
        with self._lock:
            slot = self._slots.get(str(token))
            if slot is None:
                raise ServeError("unknown episode token: use the DEEPANALYZE_MCP_URL this run gave the agent")
            if slot.claimed:
                raise ServeError("this episode is already being played by another session")
            slot.claimed = True

        def give_back() -> None:
            with self._lock:
                slot.claimed = False

        return Assignment(slot.job.row, slot.job.episode_id, self.spec.policy_id, give_back)

    def stop_agents(self) -> None:
        """Ctrl-C: kill every running agent and close their episodes at once, without waiting
        for a running cell; they are not recorded (``--resume`` runs them again)."""
        self.stopping.set()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc)
        self.hub.close_all("collect was interrupted", wait=False)

    def close(self, *, interrupted: bool = False) -> None:
        """Stop the server and close what is left; ``interrupted``: without waiting for requests
        in flight or running cells."""
        self.server.stop(force=interrupted)
        self.hub.close_all("collect stopped", wait=not interrupted)

    # ------------------------------------------------------------------ one episode

    def run(self, job: EpisodeJob) -> EpisodeOutcome:
        token = secrets.token_urlsafe(18)
        with self._lock:
            self._slots[token] = _Slot(job)
        if self.proxy is not None:
            self.proxy.open(token)
        start = time.monotonic()
        try:
            exit_code, tail = self._run_agent(job, token)
        except OSError as exc:
            if self.proxy is not None:
                self.proxy.close(token)
            return self._outcome(job, None, start, f"could not start the agent: {exc}")
        finally:
            with self._lock:
                self._slots.pop(token, None)
        trace = self.proxy.close(token) if self.proxy is not None else None
        found = self.hub.find(job.episode_id)
        key, session = found if found is not None else (None, self._left.pop(job.episode_id, None))
        try:
            if self.stopping.is_set():
                if session is not None:
                    session.abandon("collect was interrupted", wait=False)
                return self._outcome(job, None, start, "interrupted", failure="interrupted")
            if session is None:
                why = f"the agent never opened its episode (exit code {exit_code})"
                return self._outcome(job, None, start, f"{why}: {tail[-300:].strip()}")
            finished = session.ended == "finished"
            if not finished and trace is not None and trace.upstream_failures:
                session.abandon("the model endpoint failed")
                failed = f"the model endpoint failed {trace.upstream_failures} time(s)"
                return self._outcome(job, None, start, failed)
            reason = None
            if not finished:
                why = "timed out" if exit_code is None else f"exited with code {exit_code}"
                ended = f" ({session.ended})" if session.ended else ""  # e.g. it ended its MCP session
                reason = f"the agent {why} before submit_answer{ended}"
                session.abandon(reason)
            self._write(session, exit_code, time.monotonic() - start, trace, tail, reason)
            return self._outcome(job, session, start, reason)
        finally:
            wait = not self.stopping.is_set()
            if key is not None:
                self.hub.release(key, "collect is done with the episode", wait=wait)
            self.episodes.end_episode(job.episode_id, "collect is done with the episode", wait=wait)
            self._left.pop(job.episode_id, None)

    def _values(self, job: EpisodeJob, token: str) -> dict[str, str]:
        """The per-episode values an agent gets (placeholders in its command line)."""
        return {
            "mcp_url": f"{self.server.url}/mcp?episode={token}",
            "openai_base_url": f"{self.server.url}/proxy/{token}/v1" if self.proxy is not None else "",
            "task_id": job.task_id,
            "episode_id": job.episode_id,
        }

    def _environment(self, values: dict[str, str], token: str) -> dict[str, str]:
        env = dict(os.environ)
        if self.proxy is not None and self.proxy.upstream.api_key_env:
            env.pop(self.proxy.upstream.api_key_env, None)  # the agent never holds the user's key
        env.update(
            DEEPANALYZE_MCP_URL=values["mcp_url"],
            DEEPANALYZE_TASK_ID=values["task_id"],
            DEEPANALYZE_EPISODE_ID=values["episode_id"],
        )
        if self.proxy is not None:
            env.update(
                OPENAI_BASE_URL=values["openai_base_url"],
                OPENAI_API_KEY=token,
                OPENAI_MODEL=self.proxy.upstream.model or "",
            )
        return env

    def _run_agent(self, job: EpisodeJob, token: str) -> tuple[int | None, str]:
        values = self._values(job, token)
        argv = [
            part.format_map(collections.defaultdict(str, values)) for part in shlex.split(self.spec.command)
        ]
        env = self._environment(values, token)
        proc = subprocess.Popen(
            argv,
            cwd=self.spec.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills the agent and its children
        )
        with self._lock:
            self._procs.add(proc)
        tail = collections.deque(maxlen=OUTPUT_TAIL_BYTES)
        reader = threading.Thread(target=_drain, args=(proc.stdout, tail), daemon=True)
        reader.start()
        try:
            exit_code: int | None = proc.wait(timeout=self.spec.timeout_s)
        except subprocess.TimeoutExpired:
            exit_code = None
        finally:
            _kill_group(proc)
            reader.join(5)
            with self._lock:
                self._procs.discard(proc)
        return exit_code, bytes(tail).decode("utf-8", "replace")

    def _write(
        self,
        session: EpisodeSession,
        exit_code: int | None,
        seconds: float,
        trace: ProxyTrace | None,
        tail: str,
        unfinished: str | None,
    ) -> None:
        """The episode's record, with the agent's trace and (unfinished) why it ended."""
        assert session.env is not None
        session.env.extras["agent"] = {
            "kind": "black-box",
            "command": self.spec.command,
            "exit_code": exit_code,
            "seconds": round(seconds, 3),
            "model_calls": list(trace.calls) if trace is not None else [],
            "stderr_tail": tail[-2000:],
        }
        result = session.env.result()
        if unfinished is not None:
            result = replace(result, unfinished=unfinished)
        self.writer.append(build_record(result))

    @staticmethod
    def _outcome(
        job: EpisodeJob,
        session: EpisodeSession | None,
        start: float,
        error: str | None,
        failure: str = "agent_error",
    ) -> EpisodeOutcome:
        seconds = time.monotonic() - start
        if session is None:
            return EpisodeOutcome(
                job.task_id,
                None,
                None,
                error=error,
                seconds=seconds,
                episode_id=job.episode_id,
                failure=failure,
            )
        final = session.final or {"reward_status": "unfinished"}
        metadata = {k: v for k, v in final.items() if k != "reward"}
        return EpisodeOutcome(
            job.task_id,
            None,
            final.get("reward"),
            metadata,
            error=error,
            seconds=seconds,
            episode_id=job.episode_id,
        )


def _drain(stream: IO[bytes], tail: collections.deque) -> None:
    for chunk in iter(lambda: stream.read(4096), b""):
        tail.extend(chunk)
    stream.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.error("agent process %s did not exit after SIGKILL", proc.pid)


def run_jobs(
    collector: Collector,
    jobs: list[EpisodeJob],
    concurrency: int,
    on_result: Callable[[EpisodeOutcome], None],
) -> None:
    """Up to ``concurrency`` agents at once, results in plan order. The main thread waits in
    short steps (a signal lands between them); on Ctrl-C every running agent is killed, nothing
    new starts, and the running jobs are not waited for (a job may be held by a running cell)."""
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="agent")
    try:
        futures = [pool.submit(collector.run, job) for job in jobs]
        for future in futures:
            while not future.done():
                concurrent.futures.wait([future], timeout=WAIT_STEP_S)
            on_result(future.result())
    except BaseException:
        collector.stop_agents()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


@dataclass
class CollectOutcome:
    """What a ``collect`` run did: planned jobs, the outcomes of those it ran, the report."""

    jobs: list[EpisodeJob]
    results: list[EpisodeOutcome]
    done_before: int
    report: EvalReport
    folder: Path

    @property
    def failed(self) -> list[EpisodeOutcome]:
        return [r for r in self.results if not r.finished]


def collect(
    spec: AgentSpec,
    rows: list[JsonObject],
    env_config: JsonObject,
    run: RunDir,
    *,
    samples: int = 1,
    concurrency: int = 1,
    limits: ServeLimits | None = None,
    keep: RecordFilter | None = None,
    console: Console | None = None,
) -> CollectOutcome:
    """Run every pending planned episode of ``run`` (opened by ``offline.runner.open_run``) with
    the agent; consolidate the folder and write its eval report."""
    from deepanalyze_env.offline.eval_report import write_report
    from deepanalyze_env.offline.report import progress_bar
    from deepanalyze_env.offline.runner import plan_pending, progress_info

    check_servable(rows, env_config)
    jobs, left = plan_pending(rows, run, run.run_id, samples)
    results: list[EpisodeOutcome] = []
    limits = limits or ServeLimits()
    if limits.max_sessions < concurrency:  # each running agent holds one episode
        limits = replace(limits, max_sessions=concurrency)
    with sigterm_as_interrupt():  # SIGTERM stops collect as Ctrl-C does: agents killed, none recorded
        collector = Collector(spec, env_config, run.records_dir, limits)
        interrupted = True
        try:
            with progress_bar(
                "collect", total=len(jobs), console=console, completed=len(jobs) - len(left)
            ) as (progress, bar):

                def on_result(outcome: EpisodeOutcome) -> None:
                    results.append(outcome)
                    progress.update(bar, advance=1 if outcome.finished else 0, info=progress_info(results))

                run_jobs(collector, left, concurrency, on_result)
            interrupted = False
        finally:
            collector.close(interrupted=interrupted)
    run.consolidate([job.episode_id for job in jobs], keep)
    report = write_report(run.path, samples)
    return CollectOutcome(jobs, results, len(jobs) - len(left), report, run.path)
