"""Width-aware layout choice: :class:`Fitted` picks the first layout that shows its ids whole."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement

#: The width a layout is first rendered at to see its ids whole (wider than any line).
_UNBOUNDED = 10_000


def _words(text: str) -> Counter[str]:
    """The words of rendered text, less the rules and borders (whose length follows the
    width)."""
    return Counter(w for w in text.split() if not all("\u2500" <= c <= "\u257f" for c in w))


def _plain_lines(console: Console, options: ConsoleOptions, renderable: RenderableType) -> str:
    lines = console.render_lines(renderable, options, pad=False)
    return "\n".join("".join(seg.text for seg in line) for line in lines)


class Fitted:
    """The first of ``layouts`` that shows every string of ``keep`` whole at the width
    it is given, else the last one (the layout for narrow widths).

    ``keep`` holds ids (worker ids, model names, run labels): a table cut to a narrow
    terminal, or to the 80 columns rich assumes for a pipe, would fold or ellipsise
    them ("anthropic…"), which no one can copy or grep for; rather than that, the view
    changes shape.  A layout passes when each id appears in it, at this width, as many
    times as it does with no width limit.

    With ``whole_words``, a layout passes only if no word at all is folded or cut: the
    words it shows at this width are those it shows with no width limit (a table of
    figures must not fold ``40.00-60.00`` into ``40.00-6`` and ``0.00``).
    """

    def __init__(
        self,
        layouts: Sequence[RenderableType],
        keep: Iterable[str],
        *,
        whole_words: bool = False,
    ) -> None:
        if not layouts:
            raise ValueError("Fitted needs at least one layout")
        self.layouts = list(layouts)
        self.keep = sorted({k for k in keep if k}, key=len, reverse=True)
        self.whole_words = whole_words

    def _whole(self, console: Console, options: ConsoleOptions, layout: RenderableType) -> bool:
        shown = _plain_lines(console, options, layout)
        free = _plain_lines(console, options.update_width(_UNBOUNDED), layout)
        # A number in a no-wrap column squeezed below its width is cut with an ellipsis.
        if shown.count("…") > free.count("…"):
            return False
        if self.whole_words and _words(shown) != _words(free):
            return False
        return all(shown.count(k) >= free.count(k) for k in self.keep)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for layout in self.layouts[:-1]:
            if self._whole(console, options, layout):
                yield layout
                return
        yield self.layouts[-1]

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.layouts[0])
