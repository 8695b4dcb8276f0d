"""The example reward plugin (``examples/plugin``), installed for real and named by bare name in
processes that never import it: ``rollout``, ``serve --transport stdio``, ``rewards``, and an env
built in a fresh interpreter (what a Ray worker does).

Installing into a fresh venv would reinstall the project and its dependencies (minutes); instead
the plugin is built and installed with the venv's own pip and setuptools (``--no-deps
--no-build-isolation --no-index --target DIR``, no network) from a copy of its folder, and
``DIR`` goes on the subprocesses' ``PYTHONPATH``: they see its ``.dist-info`` with the entry
point exactly as they would see a ``pip install -e .`` in their venv. Each expectation is
worked out by hand: the task answers ``B``; ``answer_len_ok`` with ``limit`` 1 gives 1.0 and
under ``as: answer_empty`` with ``limit`` 0 gives 0.0, so the reward is (1 + 1 + 0) / 3.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent / "deepanalyze-rl"
CODE = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())"
SPEC = {
    "method": "verified",
    "ground_truth": "B",
    "function": [
        "answer_match",
        {"name": "answer_len_ok", "args": {"limit": 1}},
        {"name": "answer_len_ok", "args": {"limit": 0}, "as": "answer_empty"},
    ],
}
COMPONENTS = {"answer_match": 1.0, "answer_len_ok": 1.0, "answer_empty": 0.0}
TASK = {
    "id": "best-store",
    "method": "verified",
    "instruction": "Which store has the highest total revenue? Answer with the store letter.",
    "data": "data",
    "workspace_id": "ws",
    "reward_spec": SPEC,
}


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin installed into a folder of its own (built from a copy, so the source
    tree gets no build/ or egg-info)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("building the example with --no-build-isolation needs setuptools in this venv")
    work = tmp_path_factory.mktemp("plugin")
    source = work / "src"
    shutil.copytree(
        ROOT / "examples" / "plugin", source, ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    target = work / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    pip += ["--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", str(target), str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (target / "deepanalyze_plugin_example-0.1.0.dist-info" / "entry_points.txt").is_file()
    return target


def child_env(plugin_dir: Path | None) -> dict[str, str]:
    """The environment of a fresh process: the repository, and the plugin folder when given."""
    path = [str(plugin_dir)] if plugin_dir is not None else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}


def write_task(folder: Path, spec: dict[str, Any] = SPEC) -> Path:
    path = folder / "tasks.jsonl"
    path.write_text(json.dumps({**TASK, "reward_spec": spec}) + "\n")
    return path


def cli(plugin_dir: Path | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN), *args], env=child_env(plugin_dir), cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_rollout_scores_the_plugin_by_bare_name_with_per_task_arguments(
    plugin_dir: Path, workspace_root: Path, tmp_path: Path
):
    tasks = write_task(tmp_path)
    turns = [
        f"<Analyze>Sum revenue per store.</Analyze>\n<Code>\n```python\n{CODE}\n```\n</Code>",
        "<Analyze>B leads.</Analyze>\n<Answer>\nAnswer: B\n</Answer>",
    ]
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text(json.dumps({"task_id": "best-store", "label": "good", "turns": turns}) + "\n")
    args = ["rollout", "--tasks", str(tasks), "--trajectories", str(trajectories), "--labels", "good"]
    args += ["--workspace-root", str(workspace_root), "--out", str(tmp_path / "run")]
    done = cli(plugin_dir, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (record,) = [json.loads(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert record["reward_status"] == "scored" and record["reward_components"] == COMPONENTS
    assert record["reward"] == pytest.approx(2 / 3)


def test_without_the_plugin_installed_the_bare_name_is_unknown(workspace_root: Path, tmp_path: Path):
    """The negative control: nothing but the installed entry point makes the name known."""
    tasks = write_task(tmp_path)
    done = cli(None, "rewards", "--check", str(tasks), cwd=tmp_path)
    assert done.returncode == 1
    assert "unknown reward function 'answer_len_ok'" in done.stdout


def test_a_served_stdio_episode_scores_the_plugin(plugin_dir: Path, workspace_root: Path, tmp_path: Path):
    pytest.importorskip("mcp")
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    tasks = write_task(tmp_path)
    args = ["serve", "--transport", "stdio", "--tasks", str(tasks), "--task-id", "best-store"]
    args += ["--workspace-root", str(workspace_root), "--records", str(tmp_path / "rec")]
    env = child_env(plugin_dir)
    params = StdioServerParameters(
        command=str(BIN),
        args=args,
        env={k: env[k] for k in ("PYTHONPATH", "PATH", "DEEPANALYZE_SCRATCH")},
    )
    seen: dict[str, Any] = {}

    async def client() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("run_python", {"code": CODE})
            seen["end"] = await s.call_tool("submit_answer", {"answer": "B"})

    anyio.run(client)
    end = seen["end"].structured_content
    assert end["reward_status"] == "scored" and end["reward_components"] == COMPONENTS
    assert end["reward"] == pytest.approx(2 / 3)


ENV_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from deepanalyze_env.core.env import DeepAnalyzeEnv
    from deepanalyze_env.core.tasks import env_extras, load_task_files

    tasks, root = sys.argv[1], sys.argv[2]
    (row,) = load_task_files([tasks], root)
    assert "deepanalyze_plugin_example" not in sys.modules  # nothing imported it
    env = DeepAnalyzeEnv({"workspace_root": root}, extras=env_extras(row))
    if sys.argv[3:] == ["plan-only"]:  # the plan is built with the env; no kernel needed for it
        print(json.dumps({"plan": env.plan.fingerprint()}))
        sys.exit(0)
    env.init(row["prompt"])
    out = env.step("<Analyze>B.</Analyze>\\n<Answer>\\nAnswer: B\\n</Answer>")
    env.close()
    print(json.dumps({"reward": out["reward"], "components": out["metadata"]["reward_components"],
                      "plan": env.result().versions["reward_plan"]}))
    """
)


def test_an_env_built_in_a_fresh_interpreter_resolves_the_plugin(
    plugin_dir: Path, workspace_root: Path, tmp_path: Path
):
    """What a Ray worker does: a new process builds the env from a row and nothing else."""
    tasks = write_task(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", ENV_SCRIPT, str(tasks), str(workspace_root)],
        env=child_env(plugin_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["components"] == COMPONENTS and out["reward"] == pytest.approx(2 / 3)
    # the arguments are part of the plan: a different limit is a different fingerprint
    changed = json.loads(json.dumps(SPEC))
    changed["function"][1]["args"]["limit"] = 2
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            ENV_SCRIPT,
            str(write_task(tmp_path, changed)),
            str(workspace_root),
            "plan-only",
        ],
        env=child_env(plugin_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["plan"] != out["plan"]


def test_rewards_lists_the_plugin_and_check_reports_every_bad_argument(plugin_dir: Path, tmp_path: Path):
    done = cli(plugin_dir, "rewards", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    listing = {f["name"]: f for f in json.loads(done.stdout)["functions"]}
    plugin = listing["answer_len_ok"]
    assert plugin["package"] == "deepanalyze-plugin-example"
    assert plugin["arguments"] == ["limit: int = 200"] and plugin["context"] == ["answer"]
    assert plugin["components"] == ["answer_len_ok"] and plugin["needs_judge"] is False
    assert (
        listing["judge_analysis"]["package"] == "deepanalyze-env" and listing["judge_analysis"]["needs_judge"]
    )

    bad = tmp_path / "bad.jsonl"
    typo = {**SPEC, "function": [{"name": "answer_len_ok", "args": {"limt": 1}}]}
    text = {**SPEC, "function": [{"name": "answer_len_ok", "args": {"limit": "1"}}]}
    lines = [{**TASK, "id": "typo", "reward_spec": typo}, {**TASK, "id": "text", "reward_spec": text}, TASK]
    bad.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = cli(plugin_dir, "rewards", "--check", str(bad), cwd=tmp_path)
    assert done.returncode == 1
    out = " ".join(done.stdout.split())  # the console may wrap long lines
    assert "checked 3 tasks (profile v1): 1 plans built, 2 problems" in out
    assert (
        f"{bad}:0 task 'typo': reward_spec.function[0] (answer_len_ok): unknown argument 'limt' "
        "(answer_len_ok takes: limit: int = 200)"
    ) in out
    assert (
        f"{bad}:1 task 'text': reward_spec.function[0] (answer_len_ok): argument 'limit' must be int, got '1'"
        in out
    )


# ---------------------------------------------------------------------------- the loader, in-process


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder on sys.path where a test lays out installed distributions by hand (a .dist-info
    with METADATA and entry_points.txt, and their modules), with this process's registry and
    plugin state restored afterwards."""
    from rewards import plugins, registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(plugins, "_state", plugins._State())
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))  # also invalidates importlib's caches

    def install(package: str, entries: dict[str, str], modules: dict[str, str]) -> None:
        dist = site / f"{package.replace('-', '_')}-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
        (dist / "entry_points.txt").write_text(f"[deepanalyze_env.rewards]\n{lines}")
        for module, source in modules.items():
            (site / f"{module}.py").write_text(textwrap.dedent(source))

    return install


def test_two_packages_declaring_one_name_is_an_error_naming_both(fake_site):
    from rewards import RewardSpecError, resolve

    fake_site("pkg-one", {"shared_name": "pl_one:score"}, {"pl_one": "def score(answer):\n    return 1.0\n"})
    fake_site("pkg-two", {"shared_name": "pl_two:score"}, {"pl_two": "def score(answer):\n    return 0.0\n"})
    fake_site(
        "pkg-three", {"other_name": "pl_three:score"}, {"pl_three": "def score(turns):\n    return 0.5\n"}
    )
    with pytest.raises(RewardSpecError) as info:
        resolve("shared_name")
    assert str(info.value) == (
        "reward name 'shared_name' is declared by two packages: pkg-one 1.0 (shared_name = 'pl_one:score') "
        "and pkg-two 1.0 (shared_name = 'pl_two:score'); uninstall or rename one"
    )
    assert resolve("other_name").package == "pkg-three"  # the clash costs only its own name


def test_a_plugin_claiming_a_builtin_name_is_an_error_naming_both_packages(fake_site):
    from rewards import RewardSpecError, resolve

    fake_site(
        "pkg-greedy",
        {"qa_accuracy": "pl_greedy:score"},
        {"pl_greedy": "def score(answer):\n    return 1.0\n"},
    )
    with pytest.raises(RewardSpecError) as info:
        resolve("qa_accuracy")
    message = str(info.value)
    assert (
        "'qa_accuracy' is already registered by deepanalyze-env (rewards.components:qa_accuracy)" in message
    )
    assert "pkg-greedy registers another function under it (pl_greedy:score)" in message


def test_a_module_entry_registers_several_names_with_their_options(fake_site):
    from rewards import RewardPlan

    source = """
        from rewards import register_reward

        @register_reward("pl_multi_len")
        def length(answer):
            return float(len(answer or "") < 5)

        @register_reward("pl_multi_parts", components=("pl_a", "pl_b"))
        def parts(turns, bonus: float = 0.0):
            return {"pl_a": 1.0, "pl_b": min(1.0, bonus)}
    """
    fake_site("pkg-multi", {"pkg_multi": "pl_multi"}, {"pl_multi": source})
    plan = RewardPlan.build(
        {
            "method": "verified",
            "function": ["pl_multi_len", {"name": "pl_multi_parts", "args": {"bonus": 0.5}}],
        }
    )
    assert [s.component_names for s in plan.functions] == [("pl_multi_len",), ("pl_a", "pl_b")]
    assert {s.fn.package for s in plan.functions} == {"pkg-multi"}


def test_a_plugin_that_fails_to_import_is_named_and_the_others_still_work(fake_site):
    from rewards import RewardSpecError, resolve

    fake_site(
        "pkg-broken", {"broken_fn": "pl_broken:score"}, {"pl_broken": "import no_such_dependency_xyz\n"}
    )
    fake_site(
        "pkg-broken-mod", {"whatever": "pl_broken_mod"}, {"pl_broken_mod": "raise RuntimeError('boom')\n"}
    )
    fake_site("pkg-fine", {"fine_fn": "pl_fine:score"}, {"pl_fine": "def score(answer):\n    return 1.0\n"})
    assert resolve("fine_fn").package == "pkg-fine"
    with pytest.raises(
        RewardSpecError, match=r"plugin pkg-broken 1\.0 .* failed to load: ModuleNotFoundError"
    ):
        resolve("broken_fn")
    with pytest.raises(RewardSpecError) as info:
        resolve("from_the_broken_module")
    expected = "; plugin pkg-broken-mod 1.0 (whatever = 'pl_broken_mod') failed to load: RuntimeError: boom;"
    assert expected in str(info.value)
