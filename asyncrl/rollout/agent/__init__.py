"""Multi-turn agentic rollouts (docs/agents.md): token-exact trajectories, tool-call parsers, the turn loop.

    parser.py       TOOL_CALL_PARSERS (rollout.multi_turn.format): model text -> ParsedTurn (calls, errors)
    trajectory.py   Trajectory: the append-only token log (ids, loss mask, log-probs, versions, turns)
    template.py     ToolTurnRenderer: the chat template renders the tool turns, never the model's
    loop.py         AgentLoop: generate -> parse -> run tools -> append -> generate (partial rollout, resume)
    metrics.py      num_turns, tool_calls, tool errors/timeouts/latency, tokens by source; tool spans
"""

from asyncrl.rollout.agent.parser import TOOL_CALL_PARSERS, ParsedTurn, ToolCall, ToolCallParserSpec, get_parser
from asyncrl.rollout.agent.trajectory import MODEL_TOKEN, TOOL_TOKEN, ToolCallRecord, Trajectory

__all__ = [
    "MODEL_TOKEN",
    "TOOL_CALL_PARSERS",
    "TOOL_TOKEN",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParserSpec",
    "ToolCallRecord",
    "Trajectory",
    "get_parser",
]
