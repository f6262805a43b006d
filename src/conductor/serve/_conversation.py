"""A chat conversation as the one question an orchestration answers.

The Conductor and the workers see a question, not a chat, so the whole conversation
becomes one text, deterministically (the same messages always give the same text, and
so the same cache keys):

- A conversation of one user message is that message's text, unchanged: asking
  ``conductor serve`` a single question is asking ``conductor ask`` that question.
- Otherwise the text is made of up to three sections, in this order, each only when it
  has something, separated by a blank line::

      Instructions:
      <every system message's text, in order, separated by blank lines>

      Conversation so far:
      User: <text>

      Assistant: <text>

      Question:
      <the last user message's text>

  System messages count as instructions wherever they stand; every user and assistant
  message before the last user message is an earlier turn, labelled ``User:`` or
  ``Assistant:``.  Empty messages are left out.

The last user message is the question, so a conversation must end with it (an
assistant message after it would ask the orchestration to continue a reply, which it
cannot).
"""

from __future__ import annotations

from ._protocol import ApiError, ChatMessage

__all__ = ["question_text"]

_LABEL = {"user": "User", "assistant": "Assistant"}


def question_text(messages: tuple[ChatMessage, ...]) -> str:
    """The question that ``messages`` ask (see the module docstring for the layout)."""
    last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last is None:
        raise ApiError(400, "messages must hold a user message: the question", param="messages")
    if last != len(messages) - 1 and any(m.role == "assistant" for m in messages[last + 1 :]):
        raise ApiError(
            400,
            "the last message must be the user's question: an orchestration cannot "
            "continue an assistant message",
            param="messages",
        )
    question = messages[last].content
    if len(messages) == 1:
        return question
    system = [m.content.strip() for m in messages if m.role == "system" and m.content.strip()]
    turns = [
        f"{_LABEL[m.role]}: {m.content.strip()}"
        for m in messages[:last]
        if m.role != "system" and m.content.strip()
    ]
    sections: list[str] = []
    if system:
        sections.append("Instructions:\n" + "\n\n".join(system))
    if turns:
        sections.append("Conversation so far:\n" + "\n\n".join(turns))
    if not sections:
        return question
    sections.append("Question:\n" + question.strip())
    return "\n\n".join(sections)
