"""The dataset card (``README.md``) of an export: the Hub's YAML header and a body that says how
the data was made — sources, filter, splits, versions, judge prompts, kernel packages, policies,
counts, the ``stats`` figures and what every column means.

Apart from :mod:`deepanalyze_env.offline.export` (which writes the shards) because the card is
prose about the records, not the records themselves.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from deepanalyze_env.core.contracts import EpisodeRecord, JsonValue, Versions
from deepanalyze_env.core.filters import DERIVED
from deepanalyze_env.offline.stats import compute_stats, summary_rows

if TYPE_CHECKING:
    from datasets import Features

SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"))


class SourceInfo(TypedDict, total=False):
    """One source run as the card's "How it was made" table lists it (from its manifest)."""

    path: str
    episodes: int
    run_id: JsonValue
    created: JsonValue
    policy: JsonValue
    tasks: str
    samples: JsonValue


COLUMN_DOCS = {
    "episode_id": "unique id of the episode (run id, task index, sample index for `rollout` runs)",
    "run": "the run folder or file the episode came from",
    "task_id": "the task; samples of one task form a GRPO group",
    "task_hash": "hash of the task's initial state (reward_spec, input_seq, data, workspace_id)",
    "method": "`reward_spec.method`: qa, datatask, openresearch or a registered method",
    "policy_id": "who acted (`versions.policy_id`)",
    "input_seq": "the task instruction",
    "data, workspace_id": "the data folder the episode's kernel ran against",
    "messages": "the conversation, `[{role, content}]`: prompt, policy turns, `<Execute>` observations",
    "reward": "the episode reward (null unless `reward_status` is `scored`)",
    "reward_status": "`scored`, `verifier_error` or `environment_error`",
    "reward_error_cause": "why a `verifier_error` is one: `judge_parse`, `context_length`, `judge_call` or "
    "`reward_raised` (null otherwise)",
    "format_ok, gate": "whether the format gate passed, and which check failed",
    "termination": "how the episode ended (`answer`, `max_turns`, `length`, …)",
    "code_pass": "per executed cell, 1 if it ran without error",
    "turns": "policy turns",
    "error": "why an episode was not scored",
    "reward_components": "one field per reward component (null where the episode lacks it)",
    "reward_spec, exec, judge, usage, versions, timings": "the record's nested fields as JSON text "
    "(`json.loads` them): reward spec, per-cell execution status/time, judge calls and replies, token "
    "usage, versions manifest, timings",
}


# ---------------------------------------------------------------------------- the card


def _md(value: object) -> str:
    """Run text inside a Markdown table cell: no markup, no cell breaks."""
    text = " ".join(str(value).split())
    for ch, rep in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("`", "'")):
        text = text.replace(ch, rep)
    for ch in "*_[]#":
        text = text.replace(ch, "\\" + ch)
    return text


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, escape: bool = True) -> list[str]:
    """A Markdown table; cells are escaped (run data is text) unless they are this module's own prose."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md(c) if escape else str(c) for c in row) + " |" for row in rows]
    return lines


def _size_category(n: int) -> str:
    for limit, name in SIZE_CATEGORIES:
        if n < limit:
            return name
    return "1M<n<10M"


def card_metadata(
    split_counts: dict[str, int],
    split_bytes: dict[str, int],
    features: Features,
    license_id: str,
    pretty_name: str,
) -> dict[str, object]:
    """The YAML header, as a dict (validated by huggingface_hub's DatasetCardData on write)."""
    from datasets import DatasetInfo, SplitDict, SplitInfo

    splits = SplitDict()
    for name, n in split_counts.items():
        splits.add(SplitInfo(name=name, num_examples=n, num_bytes=split_bytes.get(name, 0)))
    info_yaml = DatasetInfo(features=features, splits=splits)._to_yaml_dict()
    return {
        "license": license_id,
        "pretty_name": pretty_name,
        "task_categories": ["text-generation"],
        "tags": ["deepanalyze", "data-analysis", "agent-trajectories", "reinforcement-learning", "code"],
        "size_categories": [_size_category(sum(split_counts.values()))],
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": name, "path": f"data/{name}-*"} for name in split_counts],
            }
        ],
        "dataset_info": {"features": info_yaml["features"], "splits": info_yaml["splits"]},
    }


def _versions_section(versions: Sequence[Versions]) -> list[str]:
    """The card's Versions section: package, profile, plan, judge, rubric prompts, kernel, policies."""
    lines: list[str] = []
    lines += ["", "## Versions", ""]
    rows = []
    for key, label in (
        ("package", "deepanalyze-env"),
        ("profile", "reward profile"),
        ("reward_plan", "reward plan fingerprint"),
        ("judge_model", "judge model"),
    ):
        counts = Counter(str(v.get(key)) for v in versions if v.get(key) is not None)
        rows.append([label, ", ".join(f"{k} ({n})" for k, n in sorted(counts.items())) or "–"])
    lines += _table(["what", "values (episodes)"], rows)
    prompts: dict[str, Counter[str]] = defaultdict(Counter)
    for v in versions:
        for rubric, digest in (v.get("judge_prompts") or {}).items():
            prompts[rubric][str(digest)] += 1
    if prompts:
        lines += ["", "Judge rubric prompts (sha256):", ""]
        lines += _table(
            ["rubric", "prompt hash (episodes)"],
            [[k, ", ".join(f"{d} ({n})" for d, n in sorted(c.items()))] for k, c in sorted(prompts.items())],
        )
    kernel: dict[str, Counter[str]] = defaultdict(Counter)
    for v in versions:
        for pkg, ver in (v.get("kernel") or {}).items():
            kernel[pkg][str(ver)] += 1
    if kernel:
        lines += ["", "Kernel packages (the stack the agent's code ran against):", ""]
        lines += _table(
            ["package", "version (episodes)"],
            [
                [k, ", ".join(f"{ver} ({n})" for ver, n in sorted(c.items()))]
                for k, c in sorted(kernel.items())
            ],
        )
    policies = Counter(str(v.get("policy_id")) for v in versions)
    lines += ["", "Policies:", ""]
    lines += _table(["policy id", "episodes"], sorted(policies.items()))
    return lines


def _counts_section(records: Sequence[EpisodeRecord], split_counts: dict[str, int]) -> list[str]:
    """The card's Counts and Statistics sections."""
    lines: list[str] = []
    lines += ["", "## Counts", ""]
    lines += _table(["split", "episodes"], list(split_counts.items()))
    for label, key in (("reward status", "reward_status"), ("method", None), ("termination", "termination")):
        counts = Counter(str(DERIVED["method"](r) if key is None else r.get(key)) for r in records)
        lines += [""]
        lines += _table([label, "episodes"], sorted(counts.items()))
    stats = compute_stats(records)
    lines += ["", "## Statistics (`deepanalyze-rl stats` over the exported episodes)", ""]
    lines += _table(["metric", "value"], [[k.strip(), v] for k, v in summary_rows(stats)])
    if stats["components"]:
        lines += ["", "Reward components (scored episodes):", ""]
        lines += _table(
            ["component", "n", "mean"],
            [[k, v["n"], f"{v['mean']:.4f}"] for k, v in stats["components"].items()],
        )
    return lines


def card_body(
    *,
    title: str,
    records: Sequence[EpisodeRecord],
    split_counts: dict[str, int],
    sources: Sequence[SourceInfo],
    keep: str | None,
    split_rule: str,
    episodes_in: int,
    duplicates: Sequence[str],
    dropped_by_splits: int,
) -> str:
    versions = [r.get("versions") or {} for r in records]
    lines = [f"# {_md(title)}", ""]
    lines += [
        "Trajectories of data-analysis agents in the DeepAnalyze protocol (`<Analyze>`, `<Code>`, "
        "`<Execute>`, `<Answer>` turns), collected with "
        "deepanalyze-env and exported with `deepanalyze-rl export`. Each row "
        "is one episode: the conversation, the reward with its components, and how it was scored.",
        "",
        "```python",
        "from datasets import load_dataset",
        'ds = load_dataset("path/or/hub-id")            # splits: ' + ", ".join(split_counts),
        "# SFT: the messages column is what TRL's SFTTrainer reads",
        'sft = ds["' + next(iter(split_counts)) + '"].select_columns(["messages"])',
        "```",
        "",
        "Upload with `hf upload USER/NAME DIR --repo-type dataset` (not done by the export).",
        "",
        "## How it was made",
        "",
    ]
    lines += _table(
        ["source", "run id", "created", "policy", "tasks", "samples", "episodes"],
        [
            [
                s["path"],
                s.get("run_id", "–"),
                s.get("created", "–"),
                s.get("policy", "–"),
                s.get("tasks", "–"),
                s.get("samples", "–"),
                s["episodes"],
            ]
            for s in sources
        ],
    )
    lines += [
        "",
        f"- episodes read: {episodes_in}; exported: {len(records)}",
        f"- filter (`--keep`): {'`' + keep.replace('`', chr(39)) + '`' if keep else 'none (every episode)'}",
        f"- splits: {split_rule}",
    ]
    if dropped_by_splits:
        lines.append(f"- episodes matched by no split expression (left out): {dropped_by_splits}")
    if duplicates:
        shown = ", ".join(_md(d) for d in duplicates[:10])
        lines.append(
            f"- duplicate episode ids across sources: {len(duplicates)}, kept once (the first source's "
            f"copy): {shown}{' …' if len(duplicates) > 10 else ''}"
        )
    lines += _versions_section(versions)
    lines += _counts_section(records, split_counts)
    lines += ["", "## Columns", ""]
    lines += _table(["column", "meaning"], [[f"`{k}`", v] for k, v in COLUMN_DOCS.items()], escape=False)
    lines += ["", f"Exported {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.", ""]
    return "\n".join(lines)
