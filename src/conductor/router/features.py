"""What a router sees of a question: a fixed-length vector of numbers.

A featurizer is named in the router's file (``router.json`` ``features``) with its
settings, so that the router that routes is given exactly the vectors it was fitted on;
:data:`FEATURIZERS` is the registry a name is read back through.

``hashed-ngrams-v1`` (the default) needs nothing but numpy and runs in well under a
millisecond a question: word unigrams and bigrams and character 3- to 5-grams of the
case-folded text, each hashed (CRC-32, the same in every process, unlike ``hash()``)
into one of ``dim`` buckets with a sign from another bit of the hash (so that collisions
cancel out on average instead of piling up), counted with ``1 + log(count)``, weighted
by how rare each bucket is among the training questions (an inverse document frequency
learned at the fit: the instructions every question of a benchmark shares weigh
nothing) and scaled to unit length.  A question's category shows in its words ("What
is ... * ...", "capital of", "convert ... to"), which is what decides which worker
answers it best on a pool whose workers differ by kind of question.

``gguf-mean-v1`` reads a question with a small language model instead: the mean over
its tokens of the model's last hidden state (after the output norm, what the model's
head reads), from a GGUF file run by llama.cpp in the model's host process, as ``client:
local`` workers are (:mod:`conductor.localmodel.models`; a native crash ends that process,
not the run).  The default model is the embedded SmolLM2-135M (576 numbers a question).
Each dimension is then centred and scaled by what it was on the training questions
(learned at the fit, kept with the router), so that no few dimensions of large
magnitude outweigh the rest.  The file's SHA-256 is recorded and checked before the
first question is read: other weights would give other vectors.  A question costs one
forward pass of the model (tens of milliseconds for a short one on two cores).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import UsageError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_FEATURIZER",
    "FEATURIZERS",
    "Featurizer",
    "HashedNgrams",
    "HiddenStates",
    "featurizer_from",
]

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

    @property
    def blocking(self) -> bool:
        """Whether :meth:`transform` waits on another process (a model): then a question
        is routed off the event loop."""
        ...

    def check(self) -> None:
        """Raise :class:`UsageError` now if :meth:`transform` cannot run here (a model
        file missing, or not the one fitted with), so a command fails before its run."""
        ...

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        """A ``(len(texts), dim)`` float64 array."""
        ...

    def learned(self, rows: np.ndarray, train: Sequence[int]) -> tuple[Featurizer, np.ndarray]:
        """Itself fitted to the training questions ``train`` (indices into ``rows``, what
        :meth:`transform` gave for every question), and ``rows`` as the fitted one
        gives them; a featurizer that learns nothing returns both unchanged."""
        ...


@dataclass(frozen=True)
class HashedNgrams:
    """Signed hashed counts of word 1-2-grams and character 3-5-grams (see the module)."""

    dim: int = 4096
    #: Each column's weight, learned at the fit: ``log((1 + n) / (1 + df))`` over the
    #: ``n`` training questions, ``df`` of which have the column.  A gram every training
    #: question has (the benchmark's instructions around each question) then weighs
    #: nothing, and the question's own words fill the row.  None: every column weighs 1.
    idf: tuple[float, ...] | None = None
    name: str = "hashed-ngrams-v1"
    blocking: bool = False

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dim": self.dim}
        if self.idf is not None:
            out["idf"] = list(self.idf)
        return out

    def check(self) -> None:
        return None

    def learned(self, rows: np.ndarray, train: Sequence[int]) -> tuple[Featurizer, np.ndarray]:
        import numpy as np

        seen = (rows[list(train)] != 0).sum(axis=0)
        idf = np.log((1.0 + len(train)) / (1.0 + seen))
        # A row is unit length before and after: scaling by the weights and normalising
        # again is what transform() gives with them.
        weighted = rows * idf
        norms = np.linalg.norm(weighted, axis=1, keepdims=True)
        weighted = weighted / np.where(norms > 0, norms, 1.0)
        return dataclasses.replace(self, idf=tuple(float(v) for v in idf)), weighted

    def _grams(self, text: str) -> list[str]:
        folded = " ".join(_clipped(text).casefold().split())
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
        if self.idf is not None:
            idf = self.idf
            scaled = {c: v * idf[c] for c, v in scaled.items() if idf[c]}
        norm = math.sqrt(sum(v * v for v in scaled.values()))
        return {c: v / norm for c, v in scaled.items()} if norm else {}

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        out = np.zeros((len(texts), self.dim))
        for i, text in enumerate(texts):
            for column, value in self.row(text).items():
                out[i, column] = value
        return out


#: Questions sent to the model's host in one request while fitting.
_EMBED_CHUNK = 32
#: Seconds one request of :data:`_EMBED_CHUNK` questions may take (a cold load of the
#: model included).
_EMBED_TIMEOUT_S = 600.0
#: The largest GGUF file a router may name (its SHA-256 is read in full).
_MAX_MODEL_BYTES = 64 << 30
# (path, size, mtime_ns) -> SHA-256, so that a process hashes a model file once.
_HASHED_FILES: dict[tuple[str, int, int], str] = {}
_HASH_LOCK = threading.Lock()


def _file_sha256(path: Path) -> str:
    """The SHA-256 of the regular file ``path`` (a device, FIFO or huge file is refused:
    a router's author chose the path)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UsageError(f"the features' model {str(path)!r}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_MODEL_BYTES:
        raise UsageError(f"the features' model {str(path)!r} is not a model file")
    from ..datasets.samples import sha256_file

    key = (str(path), info.st_size, info.st_mtime_ns)
    with _HASH_LOCK:
        known = _HASHED_FILES.get(key)
        if known is None:
            known = _HASHED_FILES[key] = sha256_file(path)
    return known


@dataclass(frozen=True)
class HiddenStates:
    """A GGUF model's last hidden state, averaged over a question's tokens, centred and
    scaled per dimension as on the training questions (see the module)."""

    #: ``embedded`` (the embedded SmolLM2) or the absolute path of a GGUF file.
    model: str = "embedded"
    #: The file's SHA-256 and the vectors' length, once known (at the first transform).
    sha256: str | None = None
    dim: int = 0
    #: Each dimension's mean and standard deviation on the training questions.
    center: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None
    name: str = "gguf-mean-v1"
    blocking: bool = True

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "sha256": self.sha256, "dim": self.dim}
        if self.center is not None and self.scale is not None:
            out["center"] = list(self.center)
            out["scale"] = list(self.scale)
        return out

    def path(self) -> Path:
        """The model file."""
        if self.model == "embedded":
            from ..localmodel.models import embedded_model_path

            return embedded_model_path()
        return Path(self.model)

    def checked(self) -> HiddenStates:
        """Itself with the file's SHA-256 (a :class:`UsageError` when the file is not
        the one the router was fitted with)."""
        path = self.path()
        digest = _file_sha256(path)
        if self.sha256 is not None and digest != self.sha256:
            raise UsageError(
                f"the features' model {str(path)!r} is not the file this router was fitted "
                f"with (SHA-256 {digest[:12]}..., fitted on {self.sha256[:12]}...)"
            )
        return dataclasses.replace(self, sha256=digest)

    def check(self) -> None:
        self.checked()

    def raw(self, texts: Sequence[str]) -> np.ndarray:
        """The pooled hidden states of ``texts``, as the model gives them."""
        import numpy as np

        from ..localmodel.models import get_host

        host = get_host(self.checked().path())
        rows: list[list[float]] = []
        for start in range(0, len(texts), _EMBED_CHUNK):
            chunk = [_clipped(t) for t in texts[start : start + _EMBED_CHUNK]]
            rows.extend(host.embed(chunk, timeout_s=_EMBED_TIMEOUT_S))
        out = np.asarray(rows, dtype=np.float64).reshape(len(texts), -1)
        if self.dim and out.shape[1] != self.dim:
            raise UsageError(
                f"the features' model gives {out.shape[1]} numbers a question; this router "
                f"was fitted on {self.dim}"
            )
        if not np.isfinite(out).all():
            raise UsageError("the features' model gave a hidden state that is not finite")
        return out

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        return self._standardised(self.raw(texts))

    def _standardised(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` centred and scaled as on the training questions (unchanged before
        the fit), over the square root of their length so a row is about unit length."""
        import numpy as np

        if self.center is None or self.scale is None:
            return rows
        scaled: np.ndarray = (rows - np.asarray(self.center)) / np.asarray(self.scale)
        return scaled / math.sqrt(rows.shape[1])

    def learned(self, rows: np.ndarray, train: Sequence[int]) -> tuple[Featurizer, np.ndarray]:
        import numpy as np

        fitted = rows[list(train)]
        # A dimension that never moved on the training questions says nothing: scale 1.
        spread = fitted.std(axis=0)
        learned = dataclasses.replace(
            self.checked(),
            dim=rows.shape[1],
            center=tuple(float(v) for v in fitted.mean(axis=0)),
            scale=tuple(float(v) for v in np.where(spread > 1e-12, spread, 1.0)),
        )
        return learned, learned._standardised(rows)


def _clipped(text: str) -> str:
    """At most :data:`READ_CHARS` of ``text``: its start and its end (the model reads at
    most 512 tokens of it, the same halves)."""
    if len(text) > READ_CHARS:
        return f"{text[: READ_CHARS // 2]} {text[-(READ_CHARS // 2) :]}"
    return text


def _hashed(settings: Mapping[str, Any]) -> Featurizer:
    dim = settings.get("dim", 4096)
    if not isinstance(dim, int) or isinstance(dim, bool) or not 16 <= dim <= 1 << 20:
        raise UsageError(
            f"hashed-ngrams-v1: dim must be an integer from 16 to 1048576, got {dim!r}"
        )
    unknown = sorted(set(settings) - {"dim", "idf"})
    if unknown:
        raise UsageError(f"hashed-ngrams-v1: no setting {unknown[0]!r}")
    idf = settings.get("idf")
    if idf is None:
        return HashedNgrams(dim=dim)
    weights = _numbers(idf, dim, "idf", kind="hashed-ngrams-v1", sign="non-negative")
    return HashedNgrams(dim=dim, idf=weights)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _hidden(settings: Mapping[str, Any]) -> Featurizer:
    """``gguf-mean-v1`` from its settings, every one checked: a router file's author may
    be hostile."""
    unknown = sorted(set(settings) - {"model", "sha256", "dim", "center", "scale"})
    if unknown:
        raise UsageError(f"gguf-mean-v1: no setting {unknown[0]!r}")
    model = settings.get("model", "embedded")
    if not isinstance(model, str) or not (model == "embedded" or os.path.isabs(model)):
        raise UsageError(
            f"gguf-mean-v1: model is 'embedded' or the absolute path of a GGUF file, got {model!r}"
        )
    sha = settings.get("sha256")
    if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        raise UsageError("gguf-mean-v1: sha256 is 64 lower-case hexadecimal digits")
    dim = settings.get("dim", 0)
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim <= 1 << 16:
        raise UsageError(f"gguf-mean-v1: dim must be an integer from 0 to 65536, got {dim!r}")
    center, scale = settings.get("center"), settings.get("scale")
    if (center is None) != (scale is None):
        raise UsageError("gguf-mean-v1: center and scale come together")
    if center is not None:
        center_t = _numbers(center, dim, "center", kind="gguf-mean-v1")
        scale_t = _numbers(scale, dim, "scale", kind="gguf-mean-v1", sign="positive")
        return HiddenStates(model, sha, dim, center_t, scale_t)
    return HiddenStates(model, sha, dim)


def _numbers(values: Any, dim: int, field: str, *, kind: str, sign: str = "") -> tuple[float, ...]:
    """``values`` as ``dim`` finite numbers (``sign``: ``positive``, ``non-negative`` or
    any); a :class:`UsageError` naming ``kind`` and ``field`` otherwise."""
    ok = (
        isinstance(values, list)
        and len(values) == dim > 0
        and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in values
        )
    )
    if ok and sign:
        ok = min(values) > 0 if sign == "positive" else min(values) >= 0
    if not ok:
        sort = f"{sign} finite" if sign else "finite"
        raise UsageError(f"{kind}: {field} is a list of {dim} {sort} numbers")
    return tuple(float(v) for v in values)


#: Each featurizer's name, and how it is built from its recorded settings.
FEATURIZERS: dict[str, Callable[[Mapping[str, Any]], Featurizer]] = {
    "hashed-ngrams-v1": _hashed,
    "gguf-mean-v1": _hidden,
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
