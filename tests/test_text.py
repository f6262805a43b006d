"""strip_think."""

from __future__ import annotations

import pytest

from conductor.text import strip_think


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no tags here", "no tags here"),
        ("<think>hidden</think>shown", "shown"),
        ("a<think>x</think>b<think>y</think>c", "abc"),
        ("<thinking>\nhidden\n</thinking>\nshown", "\nshown"),
        ("<THINK>hidden</Think>shown", "shown"),
        ("<think>outer <think>inner</think> still hidden</think>shown", "shown"),
        ("reasoning without an opening tag</think>answer", "answer"),
        ("a</think>b</think>c", "c"),
        ("answer first<think>then reasoning cut off", "answer first"),
        ("<think>only reasoning", ""),
        ("<think>multi\nline\n</think>\n\nAnswer: 4", "\n\nAnswer: 4"),
        ("x < y and <b>bold</b>", "x < y and <b>bold</b>"),
        ("<thinker>not a tag?</thinker>", "<thinker>not a tag?</thinker>"),
    ],
)
def test_strip_think(text: str, expected: str) -> None:
    assert strip_think(text) == expected
