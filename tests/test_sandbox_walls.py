"""The sandbox's kernel walls hold, each shown by a positive control (issue 37).

Every attack of tests/kit/sandbox_walls.py runs with every wall (its effect must not
happen) and with the walls its control names taken down (the effect must happen), in
this process and, where that is root, as uid 65534 (``run_as_nobody``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.sandbox_escapes import NOBODY, run_as_nobody
from kit.sandbox_walls import ATTACKS, run_attack

from conductor.sandbox import bubblewrap_available

REPO = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(
    not bubblewrap_available()[0], reason="bubblewrap unusable here: apt-get install bubblewrap"
)
pytestmark = [pytest.mark.process, needs_bwrap]


def _check(name: str, got: Any, who: str) -> None:
    (effect, detail), (control, control_detail) = got
    if detail.startswith("not run:"):
        pytest.skip(detail)
    assert not effect, f"{name} ({who}): the attack worked: {detail}"
    assert control, f"{name} ({who}): the positive control failed: {control_detail}"


@pytest.mark.parametrize("name", list(ATTACKS))
def test_wall_holds_and_its_control_falls(name: str) -> None:
    _check(name, run_attack(name), "this user")


@pytest.fixture(scope="module")
def as_nobody() -> dict[str, Any]:
    got = run_as_nobody(REPO / "tests" / "kit" / "sandbox_walls.py")
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.mark.parametrize("name", list(ATTACKS))
def test_wall_holds_for_an_ordinary_user(as_nobody: dict[str, Any], name: str) -> None:
    _check(name, as_nobody[name], f"uid {NOBODY}")
