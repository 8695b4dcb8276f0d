"""A tiny outside agent for ``deepanalyze-rl collect`` (and ``serve``): it speaks MCP and calls no
model. It replays the shipped reference trajectory of its task as tool calls — each ``<Code>``
turn as ``run_python``, the ``<Answer>`` as ``submit_answer`` — through the MCP URL that
``collect`` gives it (``DEEPANALYZE_MCP_URL``), and prints the reward the env returns.

    deepanalyze-rl collect --agent "python examples/replay_agent.py" \
        --tasks data/tasks/datatask.jsonl --out runs/collect-replay

Options: ``--label good|bad`` (which reference), ``--trajectories FILE``, ``--url URL`` and
``--task-id ID`` (default: the environment variables ``collect`` sets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from deepanalyze_env.core.tool_calls import from_tags, parse_turn

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "trajectories.jsonl"


def reference_calls(path: Path, task_id: str, label: str) -> list[tuple[str, dict[str, str]]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item["task_id"] == task_id and item.get("label", "good") == label:
            turns = [parse_turn(from_tags(turn)) for turn in item["turns"]]
            return [(t.call.name, t.call.arguments()) for t in turns if t.call is not None]
    raise SystemExit(f"replay_agent: no {label!r} trajectory for task {task_id!r} in {path}")


async def play(url: str, calls: list[tuple[str, dict[str, str]]]) -> int:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        prompt = await session.read_resource("deepanalyze://task/prompt")
        print(f"task prompt: {len(prompt.contents[0].text)} characters", file=sys.stderr)
        for name, arguments in calls:
            result = await session.call_tool(name, arguments)
            text = result.content[0].text if result.content else ""
            print(f"{name}: {text[:200]}", file=sys.stderr)
            if name == "submit_answer" or (result.structured_content or {}).get("reward_status"):
                print(text)
                return 0
    print("replay_agent: the trajectory has no answer", file=sys.stderr)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("DEEPANALYZE_MCP_URL"))
    parser.add_argument("--task-id", default=os.environ.get("DEEPANALYZE_TASK_ID"))
    parser.add_argument("--label", default="good")
    parser.add_argument("--trajectories", type=Path, default=SHIPPED)
    args = parser.parse_args()
    if not args.url or not args.task_id:
        parser.error("give --url and --task-id (collect sets DEEPANALYZE_MCP_URL and DEEPANALYZE_TASK_ID)")
    return anyio.run(play, args.url, reference_calls(args.trajectories, args.task_id, args.label))


if __name__ == "__main__":
    sys.exit(main())
