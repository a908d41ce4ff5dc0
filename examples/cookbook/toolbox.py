"""A plain tool server: tools and nothing else (no channels, no pushes), as an MCP tool server
would be, written with the toolkit.

    [[servers]]
    id = "toolbox"
    command = ["python", "toolbox.py"]

The agents see the tools as ``toolbox--convert``, ``toolbox--word_count`` and
``toolbox--days_between``. Each input schema comes from the type hints, each description from
the docstring; a :class:`~actors.serverkit.ToolError` is an error result the agent reads.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from actors.serverkit import MCPLServer, ToolError, ToolResult

server = MCPLServer("toolbox", push_events=False)

#: unit: (the other unit, how to get there)
CONVERSIONS = {
    "km": ("mi", lambda v: v / 1.609344),
    "mi": ("km", lambda v: v * 1.609344),
    "kg": ("lb", lambda v: v / 0.45359237),
    "lb": ("kg", lambda v: v * 0.45359237),
    "c": ("f", lambda v: v * 9 / 5 + 32),
    "f": ("c", lambda v: (v - 32) * 5 / 9),
}


@server.tool()
def convert(value: float, unit: Literal["km", "mi", "kg", "lb", "c", "f"]) -> str:
    """Convert a value to the other unit of its pair: km and mi, kg and lb, c and f."""
    other, how = CONVERSIONS[unit]
    return f"{value:g} {unit} = {how(value):.2f} {other}"


@server.tool()
def word_count(text: str) -> int:
    """How many words the text has."""
    return len(text.split())


@server.tool()
def days_between(start: str, end: str) -> ToolResult:
    """The days from one date to another, both YYYY-MM-DD."""
    try:
        first, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    except ValueError as exc:
        raise ToolError(f"dates are YYYY-MM-DD: {exc}") from None
    days = (last - first).days
    return ToolResult(content=[{"type": "text", "text": f"{days} days"}])


if __name__ == "__main__":
    server.run()
