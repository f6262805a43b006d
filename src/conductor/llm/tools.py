"""Tools in the wire formats: OpenAI Chat Completions, what the ``openai``, ``litellm``
and ``http`` clients send (:func:`openai_tool_fields`) and read back
(:func:`read_tool_calls`), and Anthropic Messages (:func:`anthropic_tool_fields`,
:func:`read_anthropic_tool_calls`).

One place knows the shapes: ``tools`` is ``[{"type": "function", "function": {"name",
"description", "parameters", "strict"}}]``, ``tool_choice`` one of ``"auto"``,
``"none"``, ``"required"`` or ``{"type": "function", "function": {"name"}}``, and a reply's
``message.tool_calls`` ``[{"id", "type": "function", "function": {"name",
"arguments"}}]`` (``arguments`` a JSON text, as the model wrote it).

Anthropic's ``tools`` are ``[{"name", "description", "input_schema"}]``, its
``tool_choice`` ``{"type": "auto" | "any" | "none"}`` or ``{"type": "tool", "name"}``,
and a reply's calls are its ``tool_use`` content blocks ``{"id", "name", "input"}``
(``input`` an object, kept here as its JSON text).
"""

from __future__ import annotations

import json
from typing import Any

from .types import ForcedTool, ModelRequest, ToolCall, ToolChoice, ToolSpec

__all__ = [
    "anthropic_tool_fields",
    "openai_tool",
    "openai_tool_choice",
    "openai_tool_fields",
    "read_anthropic_tool_calls",
    "read_tool_calls",
]

#: What Anthropic requires of a tool that describes no arguments.
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


def openai_tool(tool: ToolSpec) -> dict[str, Any]:
    """One entry of ``tools``."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def openai_tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    """``tool_choice`` as the wire spells it."""
    if isinstance(choice, ForcedTool):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def openai_tool_fields(request: ModelRequest) -> dict[str, Any]:
    """The body fields ``tools`` and ``tool_choice`` of ``request`` (none without tools)."""
    if not request.tools:
        return {}
    fields: dict[str, Any] = {"tools": [openai_tool(t) for t in request.tools]}
    if request.tool_choice is not None:
        fields["tool_choice"] = openai_tool_choice(request.tool_choice)
    return fields


def read_tool_calls(raw: Any) -> tuple[ToolCall, ...] | str:
    """The calls of a reply message's ``tool_calls`` (``None`` or ``[]``: no call), or a
    sentence saying what is wrong with them."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        return f"tool_calls is not a list but {type(raw).__name__}"
    calls: list[ToolCall] = []
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"tool_calls[{i}] has no function name"
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        if not isinstance(arguments, str):
            return f"tool_calls[{i}].function.arguments is not text"
        ident = item.get("id")
        calls.append(
            ToolCall(ident if isinstance(ident, str) else f"call_{i}", function["name"], arguments)
        )
    return tuple(calls)


def anthropic_tool_fields(request: ModelRequest) -> dict[str, Any]:
    """The Messages API fields ``tools`` and ``tool_choice`` of ``request``."""
    if not request.tools:
        return {}
    tools: list[dict[str, Any]] = []
    for tool in request.tools:
        entry: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            entry["description"] = tool.description
        entry["input_schema"] = tool.parameters or _NO_ARGUMENTS
        tools.append(entry)
    fields: dict[str, Any] = {"tools": tools}
    choice = request.tool_choice
    if isinstance(choice, ForcedTool):
        fields["tool_choice"] = {"type": "tool", "name": choice.name}
    elif choice is not None:
        fields["tool_choice"] = {"type": {"required": "any"}.get(choice, choice)}
    return fields


def read_anthropic_tool_calls(content: list[Any]) -> tuple[ToolCall, ...]:
    """The ``tool_use`` blocks of a Messages API reply's ``content`` as calls."""
    return tuple(
        ToolCall(
            block["id"] if isinstance(block.get("id"), str) else f"toolu_{i}",
            block["name"],
            json.dumps(block.get("input") or {}, ensure_ascii=False),
        )
        for i, block in enumerate(content)
        if isinstance(block, dict)
        and block.get("type") == "tool_use"
        and isinstance(block.get("name"), str)
    )
