"""Tools in the OpenAI Chat Completions wire format: what the ``openai``, ``litellm`` and
``http`` clients send (:func:`openai_tool_fields`) and read back (:func:`read_tool_calls`).

One place knows the shapes: ``tools`` is ``[{"type": "function", "function": {"name",
"description", "parameters", "strict"}}]``, ``tool_choice`` one of ``"auto"``,
``"none"``, ``"required"`` or ``{"type": "function", "function": {"name"}}``, and a reply's
``message.tool_calls`` ``[{"id", "type": "function", "function": {"name",
"arguments"}}]`` (``arguments`` a JSON text, as the model wrote it).
"""

from __future__ import annotations

from typing import Any

from .types import ForcedTool, ModelRequest, ToolCall, ToolChoice, ToolSpec

__all__ = ["openai_tool", "openai_tool_choice", "openai_tool_fields", "read_tool_calls"]


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
