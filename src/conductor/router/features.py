"""What a router sees of a question: a fixed-length vector of numbers.

A featurizer is named in the router's file (``router.json`` ``features``) with its
settings, so that the router that routes is given exactly the vectors it was fitted on;
:data:`FEATURIZERS` is the registry a name is read back through.

``hashed-ngrams-v1`` (the default) needs nothing but numpy and runs in well under a
millisecond a question: word unigrams and bigrams and character 3- to 5-grams of the
case-folded text, each hashed (CRC-32, the same in every process, unlike ``hash()``)
into one of ``dim`` buckets with a sign from another bit of the hash (so that collisions
cancel out on average instead of piling up), counted with ``1 + log(count)`` and scaled
to unit length.  A question's category shows in its words ("What is ... * ...", "capital
of", "convert ... to"), which is what decides which worker answers it best on a pool
whose workers differ by kind of question.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import UsageError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["FEATURIZERS", "DEFAULT_FEATURIZER", "Featurizer", "HashedNgrams", "featurizer_from"]

_WORD = re.compile(r"\w+|[^\w\s]")
#: The characters of a question the features read: its first and last halves of this.
#: A served conversation may be a megabyte, and routing runs before the first call, on
#: the event loop; what kind of question it is shows at its start and its end.
READ_CHARS = 8000


class Featurizer(Protocol):
    """Questions in, one row of numbers per question out."""

    @property
    def name(self) -> str:
        """The name :data:`FEATURIZERS` knows it by."""
        ...

    @property
    def dim(self) -> int:
        """How many numbers a row has."""
        ...

    def settings(self) -> dict[str, Any]:
        """What rebuilds it (JSON-ready), beside its name."""
        ...

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        """A ``(len(texts), dim)`` float64 array."""
        ...


@dataclass(frozen=True)
class HashedNgrams:
    """Signed hashed counts of word 1-2-grams and character 3-5-grams (see the module)."""

    dim: int = 4096
    name: str = "hashed-ngrams-v1"

    def settings(self) -> dict[str, Any]:
        return {"dim": self.dim}

    def _grams(self, text: str) -> list[str]:
        if len(text) > READ_CHARS:
            text = f"{text[: READ_CHARS // 2]} {text[-(READ_CHARS // 2) :]}"
        folded = " ".join(text.casefold().split())
        words = _WORD.findall(folded)
        grams = [f"w {w}" for w in words]
        grams += [f"b {a} {b}" for a, b in zip(words, words[1:], strict=False)]
        padded = f" {folded} "
        for n in (3, 4, 5):
            grams += [f"c{padded[i : i + n]}" for i in range(len(padded) - n + 1)]
        return grams

    def row(self, text: str) -> dict[int, float]:
        """The non-zero entries of ``text``'s row, as ``{column: value}``."""
        counts: dict[int, float] = {}
        for gram in self._grams(text):
            h = zlib.crc32(gram.encode("utf-8"))
            column = h % self.dim
            sign = 1.0 if (h >> 31) & 1 == 0 else -1.0
            counts[column] = counts.get(column, 0.0) + sign
        scaled = {c: math.copysign(1.0 + math.log(abs(v)), v) for c, v in counts.items() if v}
        norm = math.sqrt(sum(v * v for v in scaled.values()))
        return {c: v / norm for c, v in scaled.items()} if norm else {}

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        out = np.zeros((len(texts), self.dim))
        for i, text in enumerate(texts):
            for column, value in self.row(text).items():
                out[i, column] = value
        return out


def _hashed(settings: Mapping[str, Any]) -> Featurizer:
    dim = settings.get("dim", 4096)
    if not isinstance(dim, int) or isinstance(dim, bool) or not 16 <= dim <= 1 << 20:
        raise UsageError(
            f"hashed-ngrams-v1: dim must be an integer from 16 to 1048576, got {dim!r}"
        )
    return HashedNgrams(dim=dim)


#: Each featurizer's name, and how it is built from its recorded settings.
FEATURIZERS: dict[str, Callable[[Mapping[str, Any]], Featurizer]] = {
    "hashed-ngrams-v1": _hashed,
}
DEFAULT_FEATURIZER = "hashed-ngrams-v1"


def featurizer_from(name: str, settings: Mapping[str, Any] | None = None) -> Featurizer:
    """The featurizer ``name`` with ``settings``; a :class:`UsageError` naming the known
    ones when there is no such featurizer."""
    build = FEATURIZERS.get(name)
    if build is None:
        known = ", ".join(sorted(FEATURIZERS))
        raise UsageError(f"no featurizer {name!r} (this conductor knows {known})")
    return build(settings or {})
