"""Structured tool calling for agent RL (docs/tools.md): tool schemas (:mod:`credo.tools.schema`), parsers of the
models' native call formats (:mod:`credo.tools.parsers`), rendering through the chat template's ``tools=``
(:mod:`credo.tools.render`) and an MCP client (:mod:`credo.tools.mcp_client`, optional extra ``mcp``). The agent
loop's tool turns, which need environments and the loop, live above: :mod:`credo.rollout.tool_episode`."""
