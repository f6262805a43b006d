"""The companion of a ``conductor view`` page: each sample's details and search text in
small script files beside it, which the page loads when it needs them.

A page of 100,000 samples cannot carry every workflow, call and text and still open in
a second or two; it carries one short row per sample (the list), and this module owns
where the rest goes and in what form::

    PAGE.html                       the page (view/page.py)
    PAGE.details/d-00000.js         details of samples 0 .. CHUNK-1
    PAGE.details/d-00001.js         details of samples CHUNK .. 2*CHUNK-1, and so on
    PAGE.details/s-00000.js         the text the search looks in, same samples
    ...

Each file is one call, ``conductorViewChunk(TOKEN, KIND, NUMBER, PAYLOAD)``, with
JSON arguments (JSON is JavaScript): ``KIND`` is ``"d"`` or ``"s"``, ``TOKEN`` the page's
own (a companion left by another page is refused, not shown), and ``PAYLOAD``

- for ``d``: ``{"texts": [...], "items": [...]}``: one item per sample (see
  :func:`detail_item`), whose long texts are numbers into ``texts``, a table kept per file
  so that a system prompt sent in every step is held once;
- for ``s``: a list of one lowercased text per sample (question, subtasks, answer).

Script files, not ``fetch``: Chromium refuses ``fetch`` of a ``file://`` address, while
a ``<script src>`` added to the page loads from disk, so the page still works offline,
opened straight from the file system; its Content-Security-Policy allows scripts from its
own place and nothing else.

While the runs are read (:func:`conductor.view.data.load_runs`) the details are written
to a :class:`DetailSpool` in a temporary directory, a file per chunk as soon as it fills,
so that only a row per sample stays in memory; :meth:`DetailSpool.publish` then moves the
files beside the page.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..private import write_private
from ..redact import mask

#: A sample's details (:class:`conductor.view.data.SampleDetail`, which imports this
#: module: named here by its fields only, so that the two do not import each other).
SampleDetail = Any

__all__ = [
    "CALLBACK",
    "CHUNK",
    "DETAIL_FIELDS",
    "DetailSpool",
    "Strings",
    "chunk_name",
    "companion_dir",
    "detail_item",
    "read_chunk",
]

#: Samples per file: a file of a few hundred samples loads in milliseconds when one is
#: opened, and 100,000 samples make a few hundred files.
CHUNK = 256
#: The function each file calls (the page defines it).
CALLBACK = "conductorViewChunk"
_KINDS = ("d", "s")
#: The places of a sample's details in its item, in order (the page's ``showSample``
#: reads them so).  A step is ``[round, index, worker, status, sees, messages,
#: response, error]``, a reply ``[round, text]``, a message ``[role, text]``.
DETAIL_FIELDS = (
    "svg",
    "replies",
    "parse_errors",
    "steps",
    "why",
    "error",
    "prompt",
    "question",
    "answer",
    "gold",
    "subtasks",
)


def companion_dir(page: Path) -> Path:
    """The directory of ``page``'s details: beside it, named after it."""
    page = Path(page)
    return page.with_name(f"{page.stem}.details")


def chunk_name(kind: str, number: int) -> str:
    """The file of chunk ``number`` of ``kind`` (``"d"`` details, ``"s"`` search)."""
    if kind not in _KINDS:
        raise ValueError(f"unknown chunk kind {kind!r}")
    return f"{kind}-{number:05d}.js"


class Strings:
    """A table of texts, each stored once; a text is referred to by its place."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self.items)
            self.items.append(text)
        return found


def _js_json(data: Any) -> str:
    """``data`` as JSON (which a script file holds as it is)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def detail_item(d: SampleDetail, texts: Strings) -> list[Any]:
    """One sample's details as a chunk holds them, in the order of :data:`DETAIL_FIELDS`,
    each long text a number into ``texts``."""
    steps = [
        [
            st.round,
            st.index,
            texts(st.worker),
            st.status,
            st.sees,
            [[role, texts(content)] for role, content in st.messages],
            texts(st.response),
            st.error,
        ]
        for st in d.step_views
    ]
    replies = [[pos, texts(reply)] for pos, reply in d.replies]
    return [
        d.svg,
        replies,
        d.parse_errors,
        steps,
        d.why,
        d.error,
        d.prompt,
        d.question,
        d.answer,
        d.gold,
        d.subtasks,
    ]


def read_chunk(path: Path) -> tuple[str, str, int, Any]:
    """(token, kind, number, payload) of a chunk file (for tests and checks)."""
    text = Path(path).read_text("utf-8")
    head = f"{CALLBACK}("
    if not text.startswith(head) or not text.rstrip().endswith(");"):
        raise ValueError(f"{path}: not a chunk of conductor view's details")
    token, kind, number, payload = json.loads(f"[{text[len(head) : text.rstrip().rfind(')')]}]")
    return str(token), str(kind), int(number), payload


class DetailSpool:
    """Each sample's details and search text, written chunk by chunk to a temporary
    directory as the samples are read; :meth:`publish` moves them beside a page.

    ``chunk``: samples per file (:data:`CHUNK`; tests give fewer).
    """

    def __init__(self, chunk: int = CHUNK) -> None:
        if chunk < 1:
            raise ValueError(f"a chunk holds at least one sample, not {chunk}")
        self.chunk = chunk
        self.token = secrets.token_hex(8)
        self.count = 0
        self._dir = Path(tempfile.mkdtemp(prefix="conductor-view-"))
        # Removed when the spool is dropped (or the interpreter exits) unless published.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._texts = Strings()
        self._items: list[list[Any]] = []
        self._search: list[str] = []
        self._published: Path | None = None

    def add(self, detail: SampleDetail) -> int:
        """Spool ``detail``; return the sample's number on the page."""
        if self._published is not None:
            raise ValueError("the details were published already; no sample can be added")
        self._items.append(detail_item(detail, self._texts))
        self._search.append(detail.search_text().lower())
        self.count += 1
        if len(self._items) == self.chunk:
            self._flush()
        return self.count - 1

    def _flush(self) -> None:
        if not self._items:
            return
        number = (self.count - len(self._items)) // self.chunk
        details = {"texts": self._texts.items, "items": self._items}
        for kind, payload in (("d", details), ("s", self._search)):
            call = f"{CALLBACK}({_js_json(self.token)},{_js_json(kind)},{number},"
            # Masked as it leaves: every secret value of this process, in any case
            # (the search texts are lower-cased).
            text = f"{call}{_js_json(mask(payload))});\n"
            write_private(self._dir / chunk_name(kind, number), text)
        self._texts = Strings()
        self._items = []
        self._search = []

    @property
    def chunks(self) -> int:
        """How many files of each kind the samples spooled make."""
        return (self.count + self.chunk - 1) // self.chunk

    def publish(self, page: Path) -> Path:
        """Move the spooled files to ``page``'s companion directory (replacing what an
        earlier page of that name left there); return the directory."""
        target = companion_dir(page)
        if self._published is not None and target.resolve() == self._published.resolve():
            return target
        self._flush()
        target.mkdir(mode=0o700, exist_ok=True)
        for old in target.glob("[ds]-*.js"):
            old.unlink()
        # The first page takes the files; a second page of the same runs gets copies.
        put = shutil.copyfile if self._published is not None else shutil.move
        for n in range(self.chunks):
            for kind in _KINDS:
                name = chunk_name(kind, n)
                put(os.fspath(self._dir / name), os.fspath(target / name))
        if self._published is None:
            self._cleanup()
            self._dir = self._published = target
        return target

    def detail(self, number: int) -> dict[str, Any]:
        """The spooled details of sample ``number`` by :data:`DETAIL_FIELDS`' names, with
        its texts filled in (for tests and checks)."""
        if not 0 <= number < self.count:
            raise IndexError(f"no sample {number} among {self.count}")
        pending = self.count - len(self._items)
        if number >= pending:
            return _filled(self._items[number - pending], self._texts.items)
        _token, _kind, _n, payload = read_chunk(self._dir / chunk_name("d", number // self.chunk))
        return _filled(payload["items"][number % self.chunk], payload["texts"])


def _filled(item: list[Any], texts: Sequence[str]) -> dict[str, Any]:
    steps = [
        [
            *st[:2],
            texts[st[2]],
            st[3],
            st[4],
            [[r, texts[t]] for r, t in st[5]],
            texts[st[6]],
            st[7],
        ]
        for st in item[3]
    ]
    replies = [[p, texts[t]] for p, t in item[1]]
    return dict(zip(DETAIL_FIELDS, [item[0], replies, item[2], steps, *item[4:]], strict=True))
