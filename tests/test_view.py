"""``deepanalyze-rl view``: the page, driven in a real headless Chromium (Debian's, via Playwright).

The run comes from ``rollout`` itself (tests/viewer_runs.py); every expectation is computed here
from the records with plain Python, independently of the page's JavaScript. The browser is the
system ``chromium`` (``.ci/run`` installs it); without it these tests skip, unless
``DEEPANALYZE_REQUIRE_BROWSER=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.records import load_run, write_jsonl_atomic
from tests.viewer_runs import (
    GARBAGE_REPLY,
    JUDGE_REPLY,
    XSS_IMG,
    XSS_PRINT,
    XSS_TASK,
    shared_run,
)

KEEP = 'reward_status == "scored" and reward >= 0.5'
TAGS = re.compile(r"</?(Analyze|Understand|Code|Execute|Answer)>")


def _unavailable(reason: str):
    if os.environ.get("DEEPANALYZE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser tests required but {reason}")
    pytest.skip(reason)


def chromium_path() -> str | None:
    return (
        os.environ.get("DEEPANALYZE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def records(run_dir: Path) -> list[dict]:
    return load_run(run_dir).records


@pytest.fixture(scope="module")
def page_file(run_dir: Path) -> Path:
    out = run_dir / "episodes.html"
    assert main(["view", str(run_dir), "--out", str(out), "--keep", KEEP]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (the dev extra)")
    exe = chromium_path()
    if not exe:
        _unavailable("no chromium on PATH (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


class Watched:
    """A page plus everything it tried to do: requests, dialogs, script errors."""

    def __init__(self, browser, path: Path):
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._route)
        self.context.set_default_timeout(10_000)
        self.page = self.context.new_page()
        self.page.on("dialog", self._dialog)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']")

    def _route(self, route):
        self.requests.append(route.request.url)
        route.continue_()

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def go(self, fragment: str) -> None:
        self.page.evaluate("h => { location.hash = h; }", fragment)
        if fragment in ("", "#/"):
            self.page.wait_for_selector("#run-view:not([hidden])")
        else:
            self.page.wait_for_selector("#episode-view:not([hidden]) article.episode")

    def visible_ids(self) -> list[str]:
        return self.page.eval_on_selector_all(
            "#episodes-body tr td:first-child a", "els => els.map(e => e.textContent)"
        )


@pytest.fixture
def watched(browser, page_file: Path):
    w = Watched(browser, page_file)
    yield w
    assert w.errors == [], f"script errors on the page: {w.errors}"
    w.context.close()


def scored_reward(r: dict) -> float | None:
    return r["reward"] if r["reward_status"] == "scored" else None


def method(r: dict) -> str:
    return r["reward_spec"]["method"]


def open_episode(w: Watched, episode_id: str) -> None:
    w.go("#/")
    w.page.fill("input[name=q]", episode_id)
    w.page.click(f"#episodes-body a:text-is('{episode_id}')")
    w.page.wait_for_selector("#episode-view:not([hidden]) article.episode")


# ---------------------------------------------------------------------------- run page


def test_filters_change_the_visible_rows(watched: Watched, records: list[dict]):
    w = watched
    all_ids = [r["episode_id"] for r in records]
    assert w.visible_ids() == all_ids
    assert w.page.text_content("#count").startswith(f"{len(records)} of {len(records)} episodes")

    w.page.select_option("select[name=status]", "verifier_error")
    assert (
        w.visible_ids() == [r["episode_id"] for r in records if r["reward_status"] == "verifier_error"] != []
    )
    w.page.select_option("select[name=status]", "")
    w.page.select_option("select[name=method]", "datatask")
    assert w.visible_ids() == [r["episode_id"] for r in records if method(r) == "datatask"] != []
    w.page.select_option("select[name=method]", "")
    w.page.select_option("select[name=task]", XSS_TASK)
    assert w.visible_ids() == [r["episode_id"] for r in records if r["task_id"] == XSS_TASK]
    w.page.select_option("select[name=task]", "")

    w.page.fill("input[name=rmin]", "0.5")  # unscored episodes have no reward to compare
    expected = [r["episode_id"] for r in records if (scored_reward(r) or -9) >= 0.5]
    assert w.visible_ids() == expected and 0 < len(expected) < len(records)
    w.page.fill("input[name=rmax]", "0.45")
    assert w.visible_ids() == []
    assert w.page.text_content("#count").startswith(f"0 of {len(records)}")
    w.page.fill("input[name=rmin]", "")
    w.page.fill("input[name=rmax]", "")

    w.page.select_option("select[name=kept]", "yes")  # the view's --keep
    kept = [r["episode_id"] for r in records if r["reward_status"] == "scored" and r["reward"] >= 0.5]
    assert w.visible_ids() == kept
    w.page.select_option("select[name=kept]", "no")
    assert w.visible_ids() == [i for i in all_ids if i not in kept]
    w.page.select_option("select[name=kept]", "")

    w.page.fill("input[name=q]", "T-PLAIN")  # case-insensitive, over ids, tasks, instruction, answer, error
    assert w.visible_ids() == [r["episode_id"] for r in records if r["task_id"] == "t-plain"]
    # text only inside a cell: found once full-text search is on
    w.page.fill("input[name=q]", "undefined_name")
    assert w.visible_ids() == []
    w.page.check("input[name=full]")
    assert w.visible_ids() == [
        r["episode_id"] for r in records if "undefined_name" in json.dumps(r["messages"])
    ]
    w.page.click("#filters button:text-is('reset')")
    assert w.visible_ids() == all_ids


def test_sorting_by_reward_puts_unscored_last_both_ways(watched: Watched, records: list[dict]):
    w = watched
    scored = [r for r in records if scored_reward(r) is not None]
    unscored = [r["episode_id"] for r in records if scored_reward(r) is None]
    assert unscored
    w.page.click("th[data-key=reward] button")
    ascending = [r["episode_id"] for r in sorted(scored, key=lambda r: r["reward"])]
    assert w.visible_ids() == ascending + unscored
    w.page.click("th[data-key=reward] button")
    descending = [r["episode_id"] for r in sorted(scored, key=lambda r: -r["reward"])]
    assert w.visible_ids() == descending + unscored
    w.page.click("th[data-key=turns] button")
    assert w.visible_ids() == [r["episode_id"] for r in sorted(records, key=lambda r: r["turns"])]


def test_summary_shows_the_stats_of_the_run(watched: Watched, records: list[dict]):
    summary = watched.page.text_content("#summary")
    scored = [r for r in records if r["reward_status"] == "scored"]
    mean = sum(r["reward"] for r in scored) / len(scored)
    assert f"{mean:.3f}" in summary and f"(n={len(scored)})" in summary
    assert f"verifier_error{sum(r['reward_status'] == 'verifier_error' for r in records)}" in summary.replace(
        " ", ""
    )
    for name in {c for r in scored for c in r["reward_components"]}:
        assert name in summary


CAUSES = ("judge_parse", "context_length", "judge_call", "reward_raised")


def test_summary_shows_the_verifier_error_rate_by_cause(watched: Watched, records: list[dict]):
    summary = watched.page.text_content("#summary").replace(" ", "")
    assert "verifier_errorbycause" in summary
    for cause in CAUSES:
        n = sum(
            1
            for r in records
            if r["reward_status"] == "verifier_error"
            and (r.get("reward_error_cause") or "reward_raised") == cause
        )
        assert f"{cause}{n}{100 * n / len(records):.1f}%" in summary


def test_a_training_folder_draws_one_rising_line_per_cause(browser, run_dir: Path, tmp_path: Path):
    folder = tmp_path / "grpo-out"
    folder.mkdir()
    shutil.copy(run_dir / "episodes.jsonl", folder / "episodes.jsonl")
    rising = [0.0, 0.25, 0.5]  # a policy learning to get its episodes excluded
    lines = [
        {"step": i + 1, "verifier_error_rates": {**dict.fromkeys(CAUSES, 0.0), "context_length": rate}}
        for i, rate in enumerate(rising)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["view", str(folder)]) == 0
    w = Watched(browser, folder / "episodes.html")
    try:
        points = w.page.eval_on_selector_all(
            "svg.step-lines polyline", "els => els.map(e => [e.dataset.cause, e.getAttribute('points')])"
        )
        assert sorted(c for c, _ in points) == sorted(CAUSES)
        ys = [float(p.split(",")[1]) for p in dict(points)["context_length"].split()]
        assert ys[0] > ys[1] > ys[2]  # SVG y grows downwards: a rising rate is a falling y
        flat = [float(p.split(",")[1]) for p in dict(points)["judge_call"].split()]
        assert len(set(flat)) == 1
        rows = w.page.eval_on_selector_all(".step-table tbody tr", "els => els.map(e => e.textContent)")
        assert len(rows) == 3 and "50.0%" in rows[2]
        assert w.errors == []
    finally:
        w.context.close()


def test_paging_shows_fifty_rows_at_a_time(browser, records: list[dict], tmp_path: Path):
    many = [dict(records[i % len(records)], episode_id=f"e{i:04d}") for i in range(120)]
    write_jsonl_atomic(tmp_path / "many.jsonl", many)
    out = tmp_path / "many.html"
    assert main(["view", str(tmp_path / "many.jsonl"), "--out", str(out)]) == 0
    w = Watched(browser, out)
    try:
        assert w.visible_ids() == [f"e{i:04d}" for i in range(50)]
        w.page.click("#pager button:text-is('next ›')")
        assert w.visible_ids() == [f"e{i:04d}" for i in range(50, 100)]
        w.page.click("#pager button:text-is('next ›')")
        assert w.visible_ids() == [f"e{i:04d}" for i in range(100, 120)]
        w.page.select_option("select[name=status]", "verifier_error")  # a filter starts at page 1
        expected = [m["episode_id"] for m in many if m["reward_status"] == "verifier_error"]
        assert w.visible_ids() == expected[:50]
        assert w.errors == []
    finally:
        w.context.close()


# ---------------------------------------------------------------------------- episode page


def test_episode_page_shows_every_turn_the_components_and_the_judge(watched: Watched, records: list[dict]):
    w = watched
    record = next(
        r
        for r in records
        if r["task_id"] == XSS_TASK
        and r["reward"] == max(x["reward"] for x in records if x["task_id"] == XSS_TASK)
    )
    open_episode(w, record["episode_id"])
    page = w.page
    messages = page.query_selector_all("#episode-view .msg")
    assert len(messages) == len(record["messages"])
    assert len(page.query_selector_all("#episode-view .msg[data-role=assistant]")) == record["turns"] == 2
    for box, message in zip(messages, record["messages"], strict=True):
        shown = box.text_content()
        for line in TAGS.sub("\n", message["content"]).splitlines():
            assert line.strip() in shown
    # reward breakdown: qa's components, with the qa method's weights (qa_exact is reported, weight 0)
    rows = page.eval_on_selector_all(
        "#episode-view table.components tbody tr",
        "trs => trs.map(tr => [...tr.cells].map(c => c.textContent))",
    )
    assert rows == [
        ["qa_accuracy", "1", "1", "0.5000"],
        ["qa_analysis", "0.8000", "1", "0.4000"],
        ["qa_exact", "1", "0", "–"],
    ]
    assert "fingerprint matches" in page.text_content("#episode-view .reward")
    # the judge's reply, exactly as text, with its parsed score
    assert page.text_content("#episode-view pre.judge-reply") == JUDGE_REPLY
    assert "score 4" in page.text_content("#episode-view .judge-call")
    # the cell: highlighted code, exec status and time on its turn, output collapsible, marked truncated
    assert "import" in page.eval_on_selector_all(
        "#episode-view pre.code span.hl-kw", "s => s.map(x => x.textContent)"
    )
    assert re.search(
        r"exec: cell 1 · ok · \d+ ms", page.text_content("#episode-view .msg[data-role=assistant] .msg-head")
    )
    summary = page.text_content("#episode-view details.exec summary")
    assert "cell 1 · ok" in summary and "output truncated" in summary
    # versions manifest
    versions = page.text_content("#episode-view").split("Versions", 1)[1]
    assert record["versions"]["kernel"]["pandas"] in versions and "judge-m" in versions
    assert record["versions"]["reward_plan"] in versions


def test_unscored_episode_shows_its_error(watched: Watched, records: list[dict]):
    record = next(r for r in records if r["reward_status"] == "verifier_error")
    open_episode(watched, record["episode_id"])
    assert watched.page.text_content("#episode-view pre.episode-error") == record["error"]
    assert watched.page.text_content("#episode-view pre.judge-reply") == GARBAGE_REPLY
    assert "placeholder" in watched.page.text_content("#episode-view .reward")


def test_failed_cell_is_marked_on_its_turn(watched: Watched, records: list[dict]):
    record = next(r for r in records if r["task_id"] == "t-plain" and r["reward_status"] == "scored")
    open_episode(watched, record["episode_id"])
    heads = watched.page.eval_on_selector_all(
        "#episode-view .msg[data-role=assistant] .msg-head", "hs => hs.map(h => h.textContent)"
    )
    statuses = [e["status"] for e in record["exec"]]
    assert statuses == ["error", "ok"]
    assert "exec: cell 1 · error" in heads[0] and "exec: cell 2 · ok" in heads[1] and "exec" not in heads[2]


def test_same_task_episodes_side_by_side_best_left(watched: Watched, records: list[dict]):
    group = [r for r in records if r["task_id"] == XSS_TASK]
    best, worst = max(group, key=lambda r: r["reward"]), min(group, key=lambda r: r["reward"])
    assert best["reward"] > worst["reward"]
    open_episode(watched, worst["episode_id"])
    panel = watched.page.text_content("#episode-view .group")
    assert "Same task: 2 episodes" in panel
    watched.page.click("#episode-view a:text-is('best vs worst side by side')")
    watched.page.wait_for_selector("#episode-view .compare article.episode >> nth=1")
    shown = watched.page.eval_on_selector_all(
        "#episode-view .compare article.episode h2", "hs => hs.map(h => h.textContent)"
    )
    assert shown == [best["episode_id"], worst["episode_id"]]
    columns = watched.page.query_selector_all("#episode-view .compare article.episode")
    assert len(columns[0].query_selector_all(".msg")) == len(best["messages"])
    assert len(columns[1].query_selector_all(".msg")) == len(worst["messages"])


# ---------------------------------------------------------------------------- safety


def test_hostile_strings_are_shown_as_text_and_run_nothing(watched: Watched, records: list[dict]):
    w = watched
    cells = w.page.eval_on_selector_all(
        "#episodes-body tr td:nth-child(2)", "tds => tds.map(t => t.textContent)"
    )
    assert XSS_TASK in cells  # the task id, characters and all
    for i in range(len(records)):
        w.go(f"#/e/{i}")
    group = [i for i, r in enumerate(records) if r["task_id"] == XSS_TASK]
    w.go(f"#/c/{group[0]},{group[1]}")
    text = w.page.text_content("#episode-view")
    for hostile in (XSS_PRINT, XSS_IMG, "<script>window.__pwned=2</script>", 'onerror="window.__pwned=5"'):
        assert hostile in text
    assert "<script>window.__pwned=6</script>" in text  # the judge's reply
    w.go("#/")
    assert w.dialogs == []
    assert w.page.evaluate("typeof window.__pwned") == "undefined"
    assert w.page.evaluate("document.querySelectorAll('img, iframe, object, embed').length") == 0
    scripts = w.page.evaluate("[...document.scripts].map(s => s.type || 'js')")
    assert scripts.count("js") == 1 and len(scripts) == 3 + len(records)  # meta, index, the app, bodies
    assert w.page.evaluate("[...document.querySelectorAll('b')].some(b => b.textContent === 'bold')") is False
    assert w.requests == [w.url]


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):
        _Counter.hits.append(self.path)
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_page_makes_no_request_and_its_policy_blocks_any(watched: Watched, records: list[dict]):
    w = watched
    for i in range(len(records)):
        w.go(f"#/e/{i}")
    w.go("#/")
    w.page.fill("input[name=q]", "x")
    w.page.check("input[name=full]")
    assert w.requests == [w.url]  # only the file itself
    csp = w.page.get_attribute("meta[http-equiv=Content-Security-Policy]", "content")
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp and "unsafe-inline" not in csp
    # the policy is enforced: a request attempted from inside the page never reaches a live server
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/x"
    try:
        assert w.page.evaluate("u => fetch(u).then(() => 'fetched', () => 'blocked')", url) == "blocked"
        w.page.evaluate("u => { const i = new Image(); i.src = u; document.body.appendChild(i); }", url)
        w.page.evaluate(
            "u => { const s = document.createElement('script'); s.src = u; document.head.appendChild(s); }",
            url,
        )
        w.page.wait_for_timeout(500)
        assert _Counter.hits == []
    finally:
        server.shutdown()
        server.server_close()


def test_screenshot_has_a_real_layout(watched: Watched, tmp_path: Path):
    import matplotlib.image as mpimg

    png = watched.page.screenshot()
    (tmp_path / "run-page.png").write_bytes(png)
    pixels = mpimg.imread(io.BytesIO(png), format="png")[..., :3]
    assert pixels.shape[:2] == (1000, 1400)
    assert pixels[:30].mean() < 0.3  # the dark header bar
    body = pixels[60:]
    inked = (body.min(axis=2) < 0.9).mean()
    assert 0.03 < inked < 0.6  # text, tables and bars on a light page: neither blank nor a solid block
    colours = {tuple(c) for c in (body[::4, ::4] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 30
    row_ink = (body.min(axis=2) < 0.9).mean(axis=1)
    assert (row_ink > 0.02).sum() > 200  # many rows of the page carry content, not one band


# ---------------------------------------------------------------------------- command line


def test_view_command_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, run_dir: Path):
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().out
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["view", str(tmp_path / "empty.jsonl")]) == 2
    assert "no episode records" in capsys.readouterr().out
    assert main(["view", str(run_dir), "--keep", "rewrd > 1"]) == 2
    out = capsys.readouterr().out
    assert "unknown name 'rewrd'" in out and len(out.strip().splitlines()) == 1
    assert main(["view", str(run_dir), "--out", str(tmp_path / "page.txt")]) == 2
    assert not (tmp_path / "page.txt").exists()


def test_view_reads_a_training_output_folder(run_dir: Path, records: list[dict], tmp_path: Path):
    """A folder holding only episodes.jsonl (what `train` leaves besides its metrics); page beside it."""
    folder = tmp_path / "train-out"
    folder.mkdir()
    shutil.copy(run_dir / "episodes.jsonl", folder / "episodes.jsonl")
    assert main(["view", str(folder)]) == 0
    page = (folder / "episodes.html").read_text()
    assert page.count('<script type="application/json" id="b') == len(records)
