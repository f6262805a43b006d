"""A chat conversation as the one question an orchestration answers.

The Conductor and the workers see a question, not a chat, so the whole conversation
becomes one text, deterministically (the same messages always give the same text, and
so the same cache keys):

- A conversation of one user message, with no answer format asked, is that message's
  text, unchanged: asking ``conductor serve`` a single question is asking ``conductor
  ask`` that question.
- Otherwise the text is made of up to five sections, in this order, each only when it
  has something, separated by a blank line::

      Instructions:
      <every system message's text, in order, separated by blank lines>

      Conversation so far:
      User: <text>

      Assistant: <text>

      Assistant called get_weather({"city": "Paris"}) as call_1.

      Result of call_1 (get_weather): <text>

      Question:
      <the last user message's text>

      Tool calls made for this question:
      Assistant called get_weather({"city": "Paris"}) as call_1.

      Result of call_1 (get_weather): <text>

      Answer format:
      <what the answer format asks: the tools by name and description, the JSON shape>

  System messages count as instructions wherever they stand; every user and assistant
  message before the last user message is an earlier turn, labelled ``User:`` or
  ``Assistant:``, an assistant's tool call is ``Assistant called NAME(ARGUMENTS) as
  ID.`` and a tool message ``Result of ID (NAME): TEXT``.  The tool calls made after the
  last user message, and their results, are the section after the question: the
  answer goes on from them.  Empty messages are left out.

The last user message is the question, so a conversation must end with it or with the
tool calls and results that follow it (an assistant message with text alone after it
would ask the orchestration to continue a reply, which it cannot).
"""

from __future__ import annotations

from ..llm.answer_format import PLAIN, AnswerFormat
from ._protocol import ApiError, ChatMessage

__all__ = ["question_text"]

_LABEL = {"user": "User", "assistant": "Assistant"}


def question_text(messages: tuple[ChatMessage, ...], answer_format: AnswerFormat = PLAIN) -> str:
    """The question that ``messages`` ask (see the module docstring for the layout)."""
    last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last is None:
        raise ApiError(400, "messages must hold a user message: the question", param="messages")
    after = messages[last + 1 :]
    if any(m.role == "assistant" and not m.tool_calls for m in after):
        raise ApiError(
            400,
            "the last message must be the user's question, or tool calls and their "
            "results after it: an orchestration cannot continue an assistant message",
            param="messages",
        )
    question = messages[last].content
    note = answer_format.note()
    if len(messages) == 1 and note is None:
        return question
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    system = [m.content.strip() for m in messages if m.role == "system" and m.content.strip()]
    turns = [t for m in messages[:last] if m.role != "system" for t in _turns(m, names)]
    tools = [t for m in after if m.role != "system" for t in _turns(m, names)]
    sections: list[str] = []
    if system:
        sections.append("Instructions:\n" + "\n\n".join(system))
    if turns:
        sections.append("Conversation so far:\n" + "\n\n".join(turns))
    if not sections and not tools and note is None:
        return question
    sections.append("Question:\n" + question.strip())
    if tools:
        sections.append("Tool calls made for this question:\n" + "\n\n".join(tools))
    if note is not None:
        sections.append("Answer format:\n" + note)
    return "\n\n".join(sections)


def _turns(message: ChatMessage, names: dict[str, str]) -> list[str]:
    """The lines of one earlier message: its text, then each tool call it made."""
    text = message.content.strip()
    if message.role == "tool":
        ident = message.tool_call_id or ""
        name = names.get(ident)
        return [f"Result of {ident}{f' ({name})' if name else ''}: {text}"]
    out = [f"{_LABEL[message.role]}: {text}"] if text else []
    out += [f"Assistant called {c.name}({c.arguments}) as {c.id}." for c in message.tool_calls]
    return out
