"""Reading GBNF and telling whether a text is in its language: :func:`parse_gbnf`,
:class:`GbnfMatcher`.

``ModelRequest.grammar`` is GBNF (llama.cpp's grammar format, which the xgrammar engine
behind vLLM and SGLang also reads).  A server asked to constrain a reply to it may drop
the field unread and answer 200 anyway; the one faithful way to notice is to check the
reply against the grammar, which is what :class:`GbnfMatcher` is for
(:mod:`conductor.llm.structured` calls it).

The matcher keeps the set of parse stacks llama.cpp's own grammar sampler keeps: each
stack lists what is left to match, and a character advances every stack whose top
element accepts it.  A text is in the language when an empty stack remains at its end,
and is the beginning of a sentence (a reply cut off by ``max_tokens`` or a stop string)
when any stack remains.  Bounded repetitions (``x{0,600}``) count in their stack
frame instead of being unrolled, so the workflow grammar's long runs of characters stay
a handful of stacks.  Left recursion, which a stack matcher cannot follow, is refused.

The syntax read: rules ``name ::= ...`` (a rule goes on until the next ``name ::=``),
``"literals"`` and ``[character classes]`` (with ``^``, ranges and the escapes
``\\n \\r \\t \\\\ \\" \\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH``), ``.``, rule names,
``( groups )``, ``|``, the quantifiers ``* + ?`` and ``{m}`` ``{m,}`` ``{m,n}``, and
``#`` comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GbnfError", "GbnfMatch", "GbnfMatcher", "parse_gbnf"]


class GbnfError(ValueError):
    """A grammar this module cannot read (a syntax error, an undefined rule, left
    recursion)."""


# -- the grammar's nodes ------------------------------------------------------------
# Plain classes, hashed by identity: a parse stack holds nodes, and hashing a stack
# must not walk the grammar under each of them.


class _Node:
    __slots__ = ()


class _Lit(_Node):
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Cls(_Node):
    __slots__ = ("negated", "ranges")

    def __init__(self, negated: bool, ranges: tuple[tuple[int, int], ...]) -> None:
        self.negated = negated
        self.ranges = ranges

    def accepts(self, char: str) -> bool:
        code = ord(char)
        inside = any(lo <= code <= hi for lo, hi in self.ranges)
        return inside != self.negated


class _AnyChar(_Node):
    __slots__ = ()


class _Ref(_Node):
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Seq(_Node):
    __slots__ = ("items",)

    def __init__(self, items: tuple[_Node, ...]) -> None:
        self.items = items


class _Alt(_Node):
    __slots__ = ("options",)

    def __init__(self, options: tuple[_Node, ...]) -> None:
        self.options = options


class _Rep(_Node):
    __slots__ = ("item", "low", "high")

    def __init__(self, item: _Node, low: int, high: int | None) -> None:
        self.item = item
        self.low = low
        self.high = high


# -- parsing ----------------------------------------------------------------------

_RULE_START = re.compile(r"^[ \t]*([A-Za-z0-9_-]+)[ \t]*::=", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX = {"x": 2, "u": 4, "U": 8}


class _Parser:
    def __init__(self, text: str, rule: str) -> None:
        self.text = text
        self.pos = 0
        self.rule = rule

    def fail(self, what: str) -> GbnfError:
        near = self.text[self.pos : self.pos + 20]
        return GbnfError(f"rule {self.rule!r}: {what} at {near!r}")

    def skip(self) -> None:
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char.isspace():
                self.pos += 1
            elif char == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end == -1 else end
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def alternatives(self) -> _Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else _Alt(tuple(options))

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified(self.item()))
        return items[0] if len(items) == 1 else _Seq(tuple(items))

    def quantified(self, node: _Node) -> _Node:
        while True:
            char = self.peek()
            if char == "*":
                node, self.pos = _Rep(node, 0, None), self.pos + 1
            elif char == "+":
                node, self.pos = _Rep(node, 1, None), self.pos + 1
            elif char == "?":
                node, self.pos = _Rep(node, 0, 1), self.pos + 1
            elif char == "{":
                found = _REPEAT.match(self.text, self.pos)
                if found is None:
                    raise self.fail("a repetition must read {m}, {m,} or {m,n}")
                low = int(found.group(1))
                if found.group(2) is None:
                    high: int | None = low
                else:
                    high = int(found.group(3)) if found.group(3) else None
                if high is not None and high < low:
                    raise self.fail(f"a repetition's maximum {high} is below its minimum {low}")
                node, self.pos = _Rep(node, low, high), found.end()
            else:
                return node

    def item(self) -> _Node:
        char = self.peek()
        if char == '"':
            self.pos += 1
            chars: list[str] = []
            while True:
                if self.pos >= len(self.text):
                    raise self.fail("an unterminated string")
                char = self.text[self.pos]
                if char == '"':
                    self.pos += 1
                    return _Lit("".join(chars))
                chars.append(self.char())
        if char == "[":
            return self.char_class()
        if char == "(":
            self.pos += 1
            inner = self.alternatives()
            if self.peek() != ")":
                raise self.fail("an unclosed group")
            self.pos += 1
            return inner
        if char == ".":
            self.pos += 1
            return _AnyChar()
        found = _NAME.match(self.text, self.pos)
        if found is None:
            raise self.fail("an unexpected character")
        self.pos = found.end()
        return _Ref(found.group())

    def char_class(self) -> _Cls:
        self.pos += 1  # the "["
        negated = self.text.startswith("^", self.pos)
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= len(self.text):
                raise self.fail("an unterminated character class")
            if self.text[self.pos] == "]":
                self.pos += 1
                return _Cls(negated, tuple(ranges))
            low = ord(self.char())
            high = low
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                high = ord(self.char())
            ranges.append((low, high))

    def char(self) -> str:
        """One character of a literal or class, escapes read."""
        text = self.text
        char = text[self.pos]
        self.pos += 1
        if char != "\\":
            return char
        if self.pos >= len(text):
            raise self.fail("an escape at the end")
        code = text[self.pos]
        self.pos += 1
        if code in _ESCAPES:
            return _ESCAPES[code]
        width = _HEX.get(code)
        digits = text[self.pos : self.pos + width] if width else ""
        if width is None or len(digits) != width:
            raise self.fail(f"an unknown escape \\{code}")
        self.pos += width
        try:
            return chr(int(digits, 16))
        except ValueError:
            raise self.fail(f"a bad escape \\{code}{digits}") from None


@dataclass(frozen=True)
class _Grammar:
    rules: dict[str, _Node]
    root: str


def parse_gbnf(text: str, root: str = "root") -> _Grammar:
    """The rules of the GBNF grammar ``text``; raises :class:`GbnfError` when it cannot
    be read or names a rule it does not define."""
    starts = list(_RULE_START.finditer(text))
    if not starts:
        raise GbnfError("the grammar defines no rule (name ::= ...)")
    head = re.sub(r"#[^\n]*", "", text[: starts[0].start()])
    if head.strip():
        raise GbnfError(f"text before the first rule: {head.strip()[:20]!r}")
    rules: dict[str, _Node] = {}
    for i, start in enumerate(starts):
        name = start.group(1)
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        parser = _Parser(text[start.end() : end], name)
        body = parser.alternatives()
        if parser.peek() != "":
            raise parser.fail("an unmatched ')'")
        if name in rules:
            raise GbnfError(f"rule {name!r} is defined twice")
        rules[name] = body
    if root not in rules:
        raise GbnfError(f"the grammar has no {root!r} rule")
    for name, body in rules.items():
        missing = _undefined(body, rules)
        if missing is not None:
            raise GbnfError(f"rule {name!r} refers to {missing!r}, which is not defined")
    return _Grammar(rules, root)


def _undefined(node: _Node, rules: dict[str, _Node]) -> str | None:
    if isinstance(node, _Ref):
        return None if node.name in rules else node.name
    children: tuple[_Node, ...] = ()
    if isinstance(node, _Seq):
        children = node.items
    elif isinstance(node, _Alt):
        children = node.options
    elif isinstance(node, _Rep):
        children = (node.item,)
    for child in children:
        missing = _undefined(child, rules)
        if missing is not None:
            return missing
    return None


# -- matching ---------------------------------------------------------------------

# A stack frame: ("n", node) a node not yet expanded, ("l", literal, i) a literal
# matched up to i, ("r", rep, count) a repetition matched count times.  A stack is a
# tuple of frames, its top last.
_Frame = tuple[object, ...]
_Stack = tuple[_Frame, ...]
# How deep a stack may grow, and how many stacks one may expand to, before a character
# is consumed: a stack that keeps growing without consuming one is left recursion, and
# no grammar of this project comes near either bound (its stacks are a few frames).
_MAX_DEPTH = 1_000
_MAX_EXPANSION = 100_000
# Closures remembered per matcher before the memo starts again (memory, not speed).
_MAX_MEMO = 200_000


@dataclass(frozen=True)
class GbnfMatch:
    """How a text relates to a grammar.

    ``complete``: the text is a sentence of the grammar.  ``viable``: it is one, or the
    beginning of one (a reply cut off before its end).  ``offset``: where a text that is
    neither first left the grammar (the first character no sentence has there), else
    ``None``.
    """

    complete: bool
    viable: bool
    offset: int | None


class GbnfMatcher:
    """Matches texts against one GBNF grammar (parsed once; see :func:`parse_gbnf`)."""

    def __init__(self, grammar: str, root: str = "root") -> None:
        parsed = parse_gbnf(grammar, root)
        self._rules = parsed.rules
        self._start: _Stack = (("n", _Ref(parsed.root)),)
        self._closures: dict[_Stack, frozenset[_Stack]] = {}

    def match(self, text: str) -> GbnfMatch:
        """Where ``text`` stands against the grammar (:class:`GbnfMatch`)."""
        stacks = self._closure(self._start)
        for offset, char in enumerate(text):
            advanced: set[_Stack] = set()
            for stack in stacks:
                moved = self._advance(stack, char)
                if moved is not None:
                    advanced.update(self._closure(moved))
            if not advanced:
                return GbnfMatch(complete=False, viable=False, offset=offset)
            stacks = frozenset(advanced)
        return GbnfMatch(complete=() in stacks, viable=True, offset=None)

    @staticmethod
    def _advance(stack: _Stack, char: str) -> _Stack | None:
        """``stack`` after its top accepts ``char``, or ``None`` if it does not."""
        if not stack:
            return None
        top = stack[-1]
        if top[0] == "l":
            text, i = top[1], top[2]
            assert isinstance(text, str) and isinstance(i, int)
            if text[i] != char:
                return None
            return stack[:-1] + (("l", text, i + 1),) if i + 1 < len(text) else stack[:-1]
        node = top[1]
        if isinstance(node, _AnyChar) or (isinstance(node, _Cls) and node.accepts(char)):
            return stack[:-1]
        return None

    def _closure(self, stack: _Stack) -> frozenset[_Stack]:
        """Every stack ``stack`` expands to whose top consumes a character (or that is
        empty: the grammar's end)."""
        known = self._closures.get(stack)
        if known is not None:
            return known
        out: set[_Stack] = set()
        seen: set[_Stack] = set()
        todo = [stack]
        while todo:
            current = todo.pop()
            if current in seen:
                continue  # a repetition of something that matched nothing
            seen.add(current)
            if len(current) > _MAX_DEPTH or len(seen) > _MAX_EXPANSION:
                raise GbnfError("the grammar is left-recursive (a rule reaches itself first)")
            if not current:
                out.add(current)
                continue
            top, rest = current[-1], current[:-1]
            if top[0] == "l":
                out.add(current)
                continue
            if top[0] == "r":
                rep, count = top[1], top[2]
                assert isinstance(rep, _Rep) and isinstance(count, int)
                if count >= rep.low:
                    todo.append(rest)
                if rep.high is None or count < rep.high:
                    # Past its minimum an unbounded repetition's count no longer matters:
                    # capped, the stacks of a long run stay one.
                    again = count + 1 if rep.high is not None else min(count + 1, rep.low)
                    todo.append(rest + (("r", rep, again), ("n", rep.item)))
                continue
            node = top[1]
            if isinstance(node, (_Cls, _AnyChar)):
                out.add(current)
            elif isinstance(node, _Lit):
                todo.append(rest + (("l", node.text, 0),) if node.text else rest)
            elif isinstance(node, _Ref):
                todo.append(rest + (("n", self._rules[node.name]),))
            elif isinstance(node, _Seq):
                todo.append(rest + tuple(("n", item) for item in reversed(node.items)))
            elif isinstance(node, _Alt):
                todo.extend(rest + (("n", option),) for option in node.options)
            elif isinstance(node, _Rep):
                todo.append(rest + (("r", node, 0),))
        result = frozenset(out)
        if len(self._closures) > _MAX_MEMO:
            self._closures.clear()
        self._closures[stack] = result
        return result
