"""A minimal tool-calling agent for ``deepanalyze-rl collect``: a model behind an OpenAI-compatible
endpoint decides, the env's MCP server acts.

It reads the task from the MCP resource ``deepanalyze://task/prompt``, offers the model the
server's tools (``run_python``, ``submit_answer``) in OpenAI's function format, runs each call the
model makes through MCP and sends the result back, until the model calls ``submit_answer`` (or
stops calling tools, or ``--max-steps``). ``collect`` points it at its recording proxy through
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` and at its episode through
``DEEPANALYZE_MCP_URL``; the reward comes from the env, not from here.

    deepanalyze-rl collect --agent "python examples/openai_agent.py" --tasks TASKS.jsonl \
        --upstream-base-url http://127.0.0.1:8000/v1 --upstream-model Qwen3-8B --out runs/agent
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import anyio
import openai
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def openai_tools(tools) -> list[dict]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
        }
        for t in tools
    ]


async def play(url: str, model: str, max_steps: int, temperature: float) -> int:
    client = openai.AsyncOpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        prompt = (await session.read_resource("deepanalyze://task/prompt")).contents[0].text
        tools = openai_tools((await session.list_tools()).tools)
        messages: list[dict] = [{"role": "user", "content": prompt}]
        for _ in range(max_steps):
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=tools, temperature=temperature
            )
            message = reply.choices[0].message
            calls = message.tool_calls or []
            messages.append(message.model_dump(exclude_none=True))
            if not calls:
                print("openai_agent: the model stopped calling tools", file=sys.stderr)
                return 1
            for call in calls:
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                except ValueError:
                    arguments = {"_raw": call.function.arguments}  # the env records it as a bad call
                result = await session.call_tool(call.function.name, arguments)
                text = result.content[0].text if result.content else ""
                if (result.structured_content or {}).get("reward_status"):
                    print(text)  # the episode is over: the env scored it
                    return 0
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    print("openai_agent: out of steps", file=sys.stderr)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("DEEPANALYZE_MCP_URL"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL") or "default")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    if not args.url:
        parser.error("give --url (collect sets DEEPANALYZE_MCP_URL)")
    return anyio.run(play, args.url, args.model, args.max_steps, args.temperature)


if __name__ == "__main__":
    sys.exit(main())
