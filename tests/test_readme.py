"""Every code block of the README runs as written, so a snippet that fails is a red test.

Blocks are read from README.md in order. ``python`` blocks run in a fresh interpreter from the
repository root (their paths, ``data``, are the repository's). ``yaml`` blocks are configuration:
each top-level key is one snippet, checked by the loader that reads it (``judge`` by the env
config, ``curriculum`` by the curriculum config). ``toml`` blocks are ``pyproject.toml`` excerpts:
they must parse, and a reward entry-point table must use the group the plugin loader reads with
``module:function`` (or ``module``) values. ``bash`` blocks run in order with ``bash -e``
in one scratch folder that links the repository's ``data``, ``recipes`` and ``examples``, with a scripted
teacher and judge on 127.0.0.1 behind ``$POLICY_URL`` / ``$JUDGE_URL`` (the README's variables),
so a later block reads what an earlier one wrote. A block that cannot run here (installs, GPUs,
the 15-minute main job) is marked by the line ``<!-- readme-test: skip: REASON -->`` right
before it; the test prints every skipped block with its reason, and a marker without a reason
fails. A block in another language fails until a runner or a marker is added.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rewards.judge.fake_server import FakeJudgeServer, Reply

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*skip:\s*(?P<reason>.*?)\s*-->")
RUNNERS = ("python", "yaml", "toml", "bash")


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None  # the marker's reason

    def __str__(self) -> str:
        first = self.code.strip().splitlines()[0] if self.code.strip() else ""
        return f"README.md:{self.line} ({self.lang}) {first[:60]}"


def blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = MARKER.search(lines[i - 1]) if i else None
        if i and "readme-test" in lines[i - 1] and not (marker and marker.group("reason")):
            raise AssertionError(f"README.md:{i}: a readme-test marker needs 'skip: REASON'")
        code = "\n".join(lines[i + 1 : end]) + "\n"
        out.append(Block(i + 1, fence.group(1), code, marker.group("reason") if marker else None))
        i = end + 1
    return out


ALL = blocks(README.read_text(encoding="utf-8"))


def _runnable(lang: str) -> list[Block]:
    return [b for b in ALL if b.lang == lang and b.skip is None]


def test_every_block_runs_or_says_why_not(capsys):
    """The inventory: what runs, what is skipped and why (printed), nothing unaccounted for."""
    skipped = [b for b in ALL if b.skip is not None]
    text = [b for b in ALL if not b.lang]  # a plain fence is text (the layout tree), not code
    unknown = [b for b in ALL if b.lang and b.lang not in RUNNERS and b.skip is None]
    assert not unknown, f"no runner for these blocks (add one or a skip marker): {[str(b) for b in unknown]}"
    with capsys.disabled():
        ran = len(ALL) - len(skipped) - len(text)
        print(f"\nREADME blocks: {ran} run, {len(skipped)} skipped, {len(text)} text")
        for b in skipped:
            print(f"  skipped {b}: {b.skip}")
    assert _runnable("python") and _runnable("yaml") and _runnable("toml") and _runnable("bash")


@pytest.mark.parametrize("block", _runnable("python"), ids=str)
def test_python_block_runs_as_written(block, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DEEPANALYZE_SCRATCH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", block.code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{block} failed:\n{done.stderr[-3000:]}"


def _yaml_snippets(code: str) -> list[tuple[str, object]]:
    """One snippet per top-level key (a block may show alternatives of one key, one per line)."""
    snippets, current = [], []
    for line in code.splitlines():
        if re.match(r"^[A-Za-z_]\w*:", line) and current:
            snippets.append("\n".join(current))
            current = []
        current.append(line)
    snippets.append("\n".join(current))
    out = []
    for snippet in snippets:
        tree = yaml.safe_load(snippet)
        if tree:
            assert isinstance(tree, dict) and len(tree) == 1, snippet
            out.extend(tree.items())
    return out


@pytest.mark.parametrize("block", _runnable("yaml"), ids=str)
def test_yaml_block_is_accepted_by_its_loader(block):
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.trainers.curriculum import CurriculumConfig

    snippets = _yaml_snippets(block.code)
    assert snippets, f"{block}: no configuration in it"
    for key, value in snippets:
        if key == "curriculum":
            CurriculumConfig.from_mapping(value, "README")
        else:  # an env_config key (judge, executor, …): the env config refuses unknown keys
            EnvConfig.from_any({key: value})


@pytest.mark.parametrize("block", _runnable("toml"), ids=str)
def test_toml_block_parses_and_declares_reward_entry_points_the_loader_reads(block):
    import tomllib

    from rewards.plugins import GROUP

    tree = tomllib.loads(block.code)
    groups = tree.get("project", {}).get("entry-points", {})
    assert groups, f"{block}: no [project.entry-points.…] table"
    assert set(groups) == {GROUP}, f"{block}: entry-point group(s) {sorted(groups)}, the loader reads {GROUP}"
    for name, value in groups[GROUP].items():
        assert re.fullmatch(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?", value), f"{block}: {name} = {value!r}"


def scripted_teacher(prompt: str) -> Reply:
    """A teacher that knows the shipped QA tasks' answers. It sees the last message: the task,
    to which it answers with a cell printing the answer, then that cell's output, which it
    answers with (a served model's replies stop at ``</Code>`` / ``</Answer>``, tag left off)."""
    if "<Execute>" in prompt:
        printed = prompt.split("<Execute>", 1)[1].strip().splitlines()[0]
        return Reply(text=f"<Analyze>Done.</Analyze>\n<Answer>\nAnswer: {printed}\n")
    truth = next(
        (
            task["reward_spec"]["ground_truth"]
            for task in map(json.loads, (REPO / "data" / "tasks" / "qa.jsonl").read_text().splitlines())
            if task["instruction"] in prompt
        ),
        "unknown",
    )
    return Reply(text=f"<Analyze>Compute it.</Analyze>\n<Code>\n```python\nprint({str(truth)!r})\n```\n")


@pytest.fixture(scope="module")
def servers():
    with (
        FakeJudgeServer(scripted_teacher) as teacher,
        FakeJudgeServer(Reply(text="Weaknesses:\n- terse\nSCORE: 4")) as judge,
    ):
        yield teacher, judge


def test_bash_blocks_run_in_order_as_written(servers, tmp_path):
    teacher, judge = servers
    work = tmp_path / "work"
    work.mkdir()
    for name in ("data", "recipes", "examples"):
        (work / name).symlink_to(REPO / name)
    bin_dir = Path(sys.executable).parent  # deepanalyze-rl of this interpreter
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "DEEPANALYZE_SCRATCH": str(tmp_path / "scratch"),
        "POLICY_URL": teacher.url,
        "POLICY_MODEL": "teacher-m",
        "JUDGE_URL": judge.url,
        "JUDGE_MODEL": "judge-m",
    }
    (tmp_path / "scratch").mkdir()
    for block in _runnable("bash"):
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{block} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    # what the blocks promise exists: the teacher's episodes, the page, the dataset
    # (4 tasks x 4 samples, each right: qa_accuracy 1 and the judge's 4/5, reward 0.9, all kept)
    assert (work / "runs" / "teacher" / "kept.jsonl").read_text().count("\n") == 16
    assert (work / "runs" / "teacher" / "episodes.html").stat().st_size > 1000
    assert (work / "datasets" / "teacher" / "README.md").is_file()
    # the replay agent's episodes through collect: 4 tasks, each answered right (0.9, as above)
    collected = [
        json.loads(x) for x in (work / "runs" / "collect-replay" / "episodes.jsonl").read_text().splitlines()
    ]
    assert len(collected) == 4 and all(r["reward_status"] == "scored" for r in collected)
    assert all(
        r["agent"]["exit_code"] == 0 and r["versions"]["policy_id"] == "black-box:replay_agent"
        for r in collected
    )
    assert (work / "runs" / "collect-replay" / "episodes.html").stat().st_size > 1000
