"""Serving the env to clients outside the process (docs/design.md §15): MCP over stdio and
streamable HTTP, an OpenEnv-compatible server, and ``collect``, which runs outside agents
against them behind a recording OpenAI-compatible proxy.

Needs the ``serve`` extra (``pip install 'deepanalyze-env[serve]'``): ``mcp``, ``openenv-core``,
``uvicorn``, ``starlette``, ``httpx``. It sits above the core and the offline tools (``collect``
writes ordinary run folders and eval reports) and below the CLI.
"""
