"""``deepanalyze-rl export``: a real run folder to Parquet + card, read back with ``datasets``,
the card parsed with ``huggingface_hub``'s card classes, the messages trained on by TRL's SFTTrainer.

Expected values come from the records (read with ``load_run``) and from hand-written rules of
the export contract (an unscored episode's reward is null), never from the export code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.records import load_run, write_jsonl_atomic
from rewards.judge import prompt_hash
from tests.tiny_llama import tiny_llama
from tests.viewer_runs import XSS_TASK, shared_run

datasets = pytest.importorskip("datasets")
hub = pytest.importorskip("huggingface_hub")

PLAIN_COLUMNS = (
    "episode_id",
    "task_id",
    "task_hash",
    "input_seq",
    "data",
    "workspace_id",
    "messages",
    "reward_status",
    "reward_error_cause",
    "format_ok",
    "gate",
    "termination",
    "code_pass",
    "turns",
    "error",
)
JSON_COLUMNS = ("reward_spec", "exec", "judge", "usage", "agent", "versions", "timings")


@pytest.fixture(scope="module")
def viewer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def records(viewer_run: Path) -> list[dict]:
    return load_run(viewer_run).records


def export(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "ds"
    assert main(["export", *args, "--out", str(out)]) == 0
    return out


def load(out: Path, tmp_path: Path):
    return datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf-cache"))


def test_round_trip_gives_the_records_back(viewer_run: Path, records: list[dict], tmp_path: Path):
    out = export(tmp_path, str(viewer_run))
    ds = load(out, tmp_path)
    assert list(ds) == ["train"]
    rows = list(ds["train"])
    assert [r["episode_id"] for r in rows] == [r["episode_id"] for r in records]
    components = sorted({c for r in records for c in r["reward_components"]})
    derived = {"run", "method", "policy_id", "reward", "reward_components"}
    expected_columns = {*PLAIN_COLUMNS, *JSON_COLUMNS, *derived}
    assert set(ds["train"].column_names) == expected_columns
    for row, record in zip(rows, records, strict=True):
        for name in PLAIN_COLUMNS:
            assert row[name] == record[name], name
        for name in JSON_COLUMNS:
            assert (None if row[name] is None else json.loads(row[name])) == record[name], name
        assert row["run"] == str(viewer_run)
        assert row["method"] == record["reward_spec"]["method"]
        assert row["policy_id"] == record["versions"]["policy_id"]
        assert row["reward"] == (record["reward"] if record["reward_status"] == "scored" else None)
        assert sorted(row["reward_components"]) == components
        present = {k: v for k, v in row["reward_components"].items() if v is not None}
        assert present == record["reward_components"]


def test_card_is_valid_hub_metadata_and_says_how_the_data_was_made(
    viewer_run: Path, records: list[dict], tmp_path: Path
):
    keep = 'reward_status != "environment_error"'
    name = "Teacher <script>alert(1)</script> | run"
    out = export(tmp_path, str(viewer_run), "--keep", keep, "--license", "mit", "--name", name)
    card = hub.DatasetCard.load(out / "README.md")
    assert isinstance(card.data, hub.DatasetCardData)
    data = card.data.to_dict()
    assert data["license"] == "mit" and data["task_categories"] == ["text-generation"]
    assert data["size_categories"] == ["n<1K"] and "deepanalyze" in data["tags"]
    assert data["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}
    ]
    assert [p.name for p in (out / "data").iterdir()] == ["train-00000-of-00001.parquet"]
    ds = load(out, tmp_path)
    features = datasets.Features._from_yaml_list(data["dataset_info"]["features"])
    assert features == ds["train"].features
    [split] = data["dataset_info"]["splits"]
    assert split["name"] == "train" and split["num_examples"] == len(records) and split["num_bytes"] > 0

    body = card.text
    assert "judge-m" in body and prompt_hash("judge_analysis") in body
    assert f"pandas | {records[0]['versions']['kernel']['pandas']} ({len(records)})" in body
    assert "scripted:good" in body and "scripted:bad" in body
    assert f"`{keep}`" in body
    n_verifier = sum(r["reward_status"] == "verifier_error" for r in records)
    assert f"| verifier\\_error | {n_verifier} |" in body
    assert "| datatask | 1 |" in body
    assert " | h | " in body  # the run id, from the run's run.json
    # text from the command line or the run reaches the card body as text, not as HTML
    assert data["pretty_name"] == name
    assert "<script>" not in body and "# Teacher &lt;script&gt;alert(1)&lt;/script&gt; \\| run" in body


def test_a_filter_that_keeps_nothing_is_an_error(viewer_run: Path, tmp_path: Path, capsys):
    out = tmp_path / "ds"
    assert main(["export", str(viewer_run), "--out", str(out), "--keep", "reward > 5"]) == 2
    printed = capsys.readouterr().out
    assert printed.startswith("error: --keep 'reward > 5' keeps none of the 5 episodes")
    assert len(printed.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_merged_runs_keep_a_repeated_id_once_and_say_so(
    viewer_run: Path, records: list[dict], tmp_path: Path, capsys
):
    other = tmp_path / "other.jsonl"
    again = [dict(records[0], reward=0.123), dict(records[1], reward=0.123)]
    write_jsonl_atomic(other, [*again, dict(records[2], episode_id="new-1")])
    out = export(tmp_path, str(viewer_run), str(other))
    printed = capsys.readouterr().out
    assert "2 duplicate episode ids" in printed and records[0]["episode_id"] in printed
    rows = list(load(out, tmp_path)["train"])
    ids = [r["episode_id"] for r in rows]
    assert ids == [r["episode_id"] for r in records] + ["new-1"]
    assert rows[0]["reward"] == records[0]["reward"] != 0.123  # the first run's copy
    assert rows[-1]["run"] == str(other)
    assert "duplicate episode ids across sources: 2" in (out / "README.md").read_text()


def test_split_by_method_from_a_records_folder(viewer_run: Path, records: list[dict], tmp_path: Path):
    ds = load(export(tmp_path, str(viewer_run / "records"), "--split-by", "method"), tmp_path)
    assert {name: ds[name]["episode_id"] for name in ds} == {
        "qa": [r["episode_id"] for r in records if r["reward_spec"]["method"] == "qa"],
        "datatask": [r["episode_id"] for r in records if r["reward_spec"]["method"] == "datatask"],
    }


def test_fraction_splits_keep_each_task_in_one_split(viewer_run: Path, records: list[dict], tmp_path: Path):
    ds = load(export(tmp_path, str(viewer_run), "--splits", "train=0.5", "test=0.5"), tmp_path)
    seen = {}
    for name in ds:
        for row in ds[name]:
            assert seen.setdefault(row["task_id"], name) == name  # a GRPO group never straddles splits
    exported = sorted(i for name in ds for i in ds[name]["episode_id"])
    assert exported == sorted(r["episode_id"] for r in records)
    assert set(seen) == {XSS_TASK, "t-plain", "t-data"}


def test_expression_splits_take_the_first_match(viewer_run: Path, records: list[dict], tmp_path: Path):
    args = ["--splits", 'good=reward_status == "scored" and reward >= 0.5', "rest=True"]
    ds = load(export(tmp_path, str(viewer_run), *args), tmp_path)
    good = [r["episode_id"] for r in records if r["reward_status"] == "scored" and r["reward"] >= 0.5]
    assert ds["good"]["episode_id"] == good
    assert ds["rest"]["episode_id"] == [r["episode_id"] for r in records if r["episode_id"] not in good]


def test_bad_split_arguments_are_one_line_errors(viewer_run: Path, tmp_path: Path, capsys):
    cases = [
        (["--splits", "train=0.5", "test=0.4"], "fractions sum to 0.9"),
        (["--splits", "train=0.5", "test=reward > 0"], "not both"),
        (["--splits", "bad name=0.5"], "not a valid split name"),
        (["--split-by", "nosuch"], "not a record field"),
        (["--split-by", "messages"], "holds lists"),
    ]
    for args, message in cases:
        assert main(["export", str(viewer_run), "--out", str(tmp_path / "ds"), *args]) == 2
        printed = capsys.readouterr().out
        assert message in printed and len(printed.strip().splitlines()) == 1, printed
        assert not (tmp_path / "ds").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["export", str(viewer_run), "--out", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().out


def test_messages_column_trains_with_trl_sft_trainer(viewer_run: Path, tmp_path: Path, tiny_tokenizer):
    torch = pytest.importorskip("torch")
    trl = pytest.importorskip("trl")

    ds = load(export(tmp_path, str(viewer_run), "--keep", 'reward_status == "scored"'), tmp_path)["train"]
    torch.manual_seed(0)
    tok = tiny_tokenizer
    model = tiny_llama(tok, max_position_embeddings=4096)
    config = trl.SFTConfig(
        output_dir=str(tmp_path / "sft"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        max_steps=1,
        logging_steps=1,
        per_device_train_batch_size=2,
        max_length=2048,
    )
    trainer = trl.SFTTrainer(
        model=model, args=config, train_dataset=ds.select_columns(["messages"]), processing_class=tok
    )
    first = tok.decode(trainer.train_dataset[0]["input_ids"])
    assert ds[0]["messages"][1]["content"][:40] in first  # the chat template saw the conversation
    trainer.train()
    assert trainer.state.global_step == 1
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(loss == loss and loss > 0 for loss in losses)
