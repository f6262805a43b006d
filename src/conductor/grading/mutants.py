"""Mutant copies of a BigCodeBench test, for differential grading.

Why: a BigCodeBench test must run in the solution's own process (it patches the modules
the solution uses and calls the solution directly), so whatever decides its verdict
lives within the solution's reach.  A program that *forges* a pass (steals the judge's
secret, rewrites the verdict channel, reads the expected value out of the test and
returns it, rigs the test's mocks) forges it whatever the test says, and so it also
passes a copy of the test whose expected values were changed, which no program that
computes the answer can pass.  The grader runs a passing solution again against such
*mutant* copies (:mod:`conductor.grading.code`); passing a mutated test is evidence of
tampering, not of skill.

A mutant changes, in each test method where one can be found, exactly one **site**: a
check that runs on every execution of the method that reaches its end, so that a
program which passed the original method necessarily reaches the changed check and
fails it.  The kinds of change, each chosen so an honest pass turns into a failure:

* ``value``: a literal that a check compares by equality (``assertEqual(x, 15)``,
  ``assertEqual(result, [1, 2])``, ``mock.assert_called_once_with('a.txt')``,
  ``assert x == 3``, ``assertIn('start_time', result)`` for a needle of 4 or more
  characters) is replaced by another value of the same type (``15 -> 16``, one
  element of a list, one character of a string, ``True -> False``); a tolerance
  check (``assertAlmostEqual``, ``numpy.testing.assert_allclose``) moves by far more
  than its tolerance;
* ``negation``: a check is replaced by its opposite (``assertTrue`` <-> ``assertFalse``,
  ``assertIn`` <-> ``assertNotIn``, ``assertGreater`` <-> ``assertLessEqual``,
  ``assert X`` -> ``assert not (X)``, ``assert_called_once()`` -> ``assert_not_called()``);
* ``exception``: ``assertRaises(E)`` expects a builtin exception outside E's family
  (neither a base nor a subclass of it), so the exception the program raises escapes.

Where a check is reached: a statement of the method's body, or of a ``with`` block
whose context managers are known not to swallow exceptions (``mock.patch``, ``open``,
``subTest``, temporary files, ...), or of a ``for`` loop over a non-empty literal (its
first pass), before any ``return``, ``raise``, ``break`` or ``continue`` at that level.
Never inside ``if``, ``try``, ``while``, an ``assertRaises`` block, a nested function or
a comprehension.  Checks whose arguments depend on what the solution returned (names
assigned from a call of the entry point, the test's mocks) are preferred, since a
program that reads expected values out of the test is caught only there; any reached
check catches a program that forges the verdict itself.

A mutant is the original text with the chosen spans replaced, formatted as the
original's literals were (the same quote character), so that nothing but the changed
values tells a copy from the original, and the sandbox that runs a copy is started the
same way for every copy (see the grader).  The choice of sites and values comes from a
random source the caller seeds: secret by default, so a program cannot compute in
advance which copy it will hold.

What this cannot do: a program that *knows* the original test (memorised from the
public data set) or that computes some tests' answers honestly and compares them with
the values in the copy it holds can tell a mutant apart, and then forge only in the
original; test methods with no reachable check (a method whose only check is a
helper method's) are not checked at all (the verdict records how many were).
"""

from __future__ import annotations

import ast
import builtins
import random
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["Mutation", "MutantTest", "Site", "find_sites", "make_mutants"]


@dataclass(frozen=True)
class Site:
    """One check of a test method that a mutant may change."""

    method: str
    line: int
    #: ``value``, ``negation`` or ``exception``
    kind: str
    #: what the check is (``assertEqual``, ``assert``, ``assert_called_once_with``, ...)
    check: str
    #: whether the check reads what the solution produced
    dependent: bool
    #: (start, end) offsets in the source and the replacement text, for each choice
    choices: tuple[tuple[tuple[int, int, str], ...], ...]


@dataclass(frozen=True)
class Mutation:
    """What one mutant changed in one test method (recorded on a ``tampered`` verdict)."""

    method: str
    line: int
    kind: str
    check: str
    before: str
    after: str

    def describe(self) -> str:
        """One line for a verdict's reason."""
        return f"{self.method} line {self.line}: {self.check} {self.before!r} -> {self.after!r}"


@dataclass(frozen=True)
class MutantTest:
    """A mutant copy of a test source and the one change it made in each method."""

    source: str
    mutations: tuple[Mutation, ...]

    def mutation_of(self, method: str) -> Mutation | None:
        """The change made in ``method``, or None where it is as in the original."""
        return next((m for m in self.mutations if m.method == method), None)


# ----------------------------------------------------------------------------- checks

# unittest checks that compare their first two arguments by equality
_EQUALITY = frozenset(
    {
        "assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual",
        "assertDictEqual", "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual",
        "assertCountEqual", "assertItemsEqual", "failUnlessEqual", "assert_array_equal",
        "assert_equal", "assert_series_equal", "assert_frame_equal", "assert_index_equal",
    }
)  # fmt: skip
# checks with a tolerance: a value moves by more than any tolerance a literal gives
_CLOSE = frozenset(
    {"assertAlmostEqual", "assertAlmostEquals", "assert_almost_equal", "assert_allclose",
     "assert_array_almost_equal"}
)  # fmt: skip
# each check and its opposite
_OPPOSITE = {
    "assertTrue": "assertFalse", "assertFalse": "assertTrue",
    "assertEqual": "assertNotEqual", "assertNotEqual": "assertEqual",
    "assertAlmostEqual": "assertNotAlmostEqual", "assertNotAlmostEqual": "assertAlmostEqual",
    "assertIn": "assertNotIn", "assertNotIn": "assertIn",
    "assertIs": "assertIsNot", "assertIsNot": "assertIs",
    "assertIsNone": "assertIsNotNone", "assertIsNotNone": "assertIsNone",
    "assertIsInstance": "assertNotIsInstance", "assertNotIsInstance": "assertIsInstance",
    "assertGreater": "assertLessEqual", "assertLessEqual": "assertGreater",
    "assertLess": "assertGreaterEqual", "assertGreaterEqual": "assertLess",
    "assertRegex": "assertNotRegex", "assertNotRegex": "assertRegex",
    "assert_called_once": "assert_not_called", "assert_called": "assert_not_called",
    "assert_not_called": "assert_called",
}  # fmt: skip
# mock checks that compare the expected call by equality with the last (or only) call
_MOCK_CALL = frozenset({"assert_called_once_with", "assert_called_with"})
_RAISES = frozenset({"assertRaises", "assertRaisesRegex", "assertRaisesRegexp"})
# context managers that never swallow an exception of their block
_TRANSPARENT = frozenset(
    {
        "patch", "object", "dict", "multiple", "open", "subTest", "TemporaryDirectory",
        "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile", "catch_warnings",
        "assertLogs", "assertNoLogs", "redirect_stdout", "redirect_stderr", "StringIO",
        "BytesIO", "errstate", "option_context", "ExitStack", "chdir", "scandir",
        "assertWarns", "assertWarnsRegex", "Pool", "ThreadPoolExecutor", "mkdtemp",
    }
)  # fmt: skip
# exceptions an ``assertRaises`` may be moved to: leaves that libraries seldom derive
# from, so that what the program raises is not one of them
_OTHER_EXCEPTIONS = (
    "ZeroDivisionError", "NotADirectoryError", "RecursionError", "ChildProcessError",
    "UnboundLocalError", "BrokenPipeError", "IsADirectoryError", "TabError",
)  # fmt: skip
_MIN_NEEDLE = 4


def _name_of(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _is_literal(node: ast.expr) -> bool:
    """A literal whose value the text fully gives (no names, no calls)."""
    if isinstance(node, ast.Constant):
        return node.value is not Ellipsis
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) in (
            int,
            float,
        )
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return bool(node.elts) and all(_is_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return bool(node.keys) and all(
            k is not None and _is_literal(k) and _is_literal(v)
            for k, v in zip(node.keys, node.values, strict=True)
        )
    return False


class _Text:
    """The source and the offset of each line, for node spans."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def span(self, node: ast.AST) -> tuple[int, int]:
        # ast's columns count UTF-8 bytes: a line with non-ASCII text is measured so
        start_line, end_line = node.lineno, node.end_lineno  # type: ignore[attr-defined]
        start = self._offset(start_line, node.col_offset)  # type: ignore[attr-defined]
        end = self._offset(end_line, node.end_col_offset)  # type: ignore[attr-defined]
        return start, end

    def _offset(self, line: int, col: int) -> int:
        begin = self.starts[line - 1]
        text = self.source[begin : self.starts[line] if line < len(self.starts) else None]
        return begin + len(text.encode("utf-8")[:col].decode("utf-8", "replace"))

    def of(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end]


# ------------------------------------------------------------------------ new values


def _other_int(value: int, rng: random.Random) -> int:
    step = rng.choice((1, 2, 3))
    return value + step if value >= 0 or rng.random() < 0.5 else value - step


def _other_float(value: float, rng: random.Random, far: bool) -> float:
    if far:
        # more than any tolerance a test gives in practice (places >= 1, rtol < 0.5)
        return value + rng.choice((1, -1)) * max(1.0, abs(value)) * rng.choice((0.5, 0.75, 1.5))
    return value + rng.choice((1.0, 0.5, 2.0, -1.0))


def _other_str(value: str, rng: random.Random) -> str:
    if not value:
        return rng.choice(string.ascii_lowercase)
    spots = [i for i, c in enumerate(value) if c.isalnum()] or list(range(len(value)))
    i = rng.choice(spots)
    c = value[i]
    if c.isdigit():
        pool = string.digits
    elif c.isupper():
        pool = string.ascii_uppercase
    elif c.isalpha():
        pool = string.ascii_lowercase
    else:
        pool = string.ascii_lowercase
    new = rng.choice([p for p in pool if p != c])
    return value[:i] + new + value[i + 1 :]


def _str_literal(original: str, value: str) -> str | None:
    """``value`` written as ``original`` (a string literal's text) was: its prefix and
    quotes.  None where that form cannot hold it (a raw string, an f-string)."""
    i = 0
    while i < len(original) and original[i] in "bBrRuUfF":
        i += 1
    prefix, body = original[:i], original[i:]
    if any(p in prefix.lower() for p in "rf"):
        return None
    quote = next((q for q in ('"""', "'''", '"', "'") if body.startswith(q)), None)
    if quote is None:
        return None
    text = repr(value)  # Python's own escaping, with its own quote
    inner = text[1:-1]
    if text[0] != quote[0]:
        inner = inner.replace("\\" + text[0], text[0]).replace(quote[0], "\\" + quote[0])
    if len(quote) == 3 and inner.endswith(quote[0]):
        inner = inner[:-1] + "\\" + quote[0]
    return prefix + quote + inner + quote


def _new_literal(original: str, rng: random.Random, far: bool) -> str | None:
    """Another value for the literal whose text is ``original`` (a constant or a signed
    number), written as the original was; None where there is none to give."""
    try:
        node = ast.parse("(" + original + ")", mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if type(value) is int:
            return repr(_other_int(-value if isinstance(node.op, ast.USub) else value, rng))
        if type(value) is float:
            signed = -value if isinstance(node.op, ast.USub) else value
            return repr(_other_float(signed, rng, far))
        return None
    if not isinstance(node, ast.Constant):
        return None
    value = node.value
    if type(value) is bool:
        return repr(not value)
    if type(value) is int:
        return repr(_other_int(value, rng))
    if type(value) is float:
        return repr(_other_float(value, rng, far))
    if type(value) is str:
        return _str_literal(original, _other_str(value, rng))
    if type(value) is bytes:
        return repr(_other_str(value.decode("latin-1"), rng).encode("latin-1"))
    return None


def _leaves(node: ast.expr) -> Iterator[ast.expr]:
    """The constants of a literal (and its negative numbers), in order."""
    if isinstance(node, (ast.Constant, ast.UnaryOp)):
        yield node
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for elt in node.elts:
            yield from _leaves(elt)
    elif isinstance(node, ast.Dict):
        for value in node.values:
            yield from _leaves(value)


def _value_choices(
    literals: Sequence[ast.expr], text: _Text, far: bool
) -> tuple[tuple[tuple[int, int, str], ...], ...]:
    """One replacement per constant of these literals; the value is drawn when a mutant
    is made (:func:`_draw`), so the text is a marker here."""
    out = []
    for literal in literals:
        for leaf in _leaves(literal):
            if isinstance(leaf, ast.Constant) and leaf.value is None:
                continue
            start, end = text.span(leaf)
            out.append(((start, end, "far" if far else "near"),))
    return tuple(out)


# -------------------------------------------------------------------------- the walk


def _transparent(item: ast.withitem) -> bool:
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return False
    return _name_of(call.func) in _TRANSPARENT


def _literal_iterable(node: ast.expr, bound: dict[str, ast.expr]) -> bool:
    """Whether iterating ``node`` surely gives a first item: a non-empty literal, a
    name bound once in the method to one, or ``range`` of literal bounds."""
    if isinstance(node, ast.Name) and node.id in bound:
        node = bound[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return bool(node.elts)
    if isinstance(node, ast.Dict):
        return bool(node.keys)
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return bool(node.value)
    if isinstance(node, ast.Call) and _name_of(node.func) == "range" and not node.keywords:
        values = [
            a.value for a in node.args if isinstance(a, ast.Constant) and type(a.value) is int
        ]
        if len(values) == len(node.args):
            try:
                return len(range(*values)) > 0
            except (TypeError, ValueError):
                return False
    return False


def _literal_bindings(method: ast.FunctionDef) -> dict[str, ast.expr]:
    """Names the method binds exactly once, by a plain ``name = <display>`` statement
    of its own body (what a loop over that name iterates)."""
    counts: dict[str, int] = {}
    for node in ast.walk(method):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            counts[node.id] = counts.get(node.id, 0) + 1
    bound: dict[str, ast.expr] = {}
    for stmt in method.body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and counts.get(stmt.targets[0].id) == 1
        ):
            bound[stmt.targets[0].id] = stmt.value
    return bound


def _reached(body: Sequence[ast.stmt], bound: dict[str, ast.expr]) -> list[ast.stmt]:
    """The statements of ``body`` that run whenever the method gets past them (see the
    module's doc), nested blocks included where they are sure to run."""
    found: list[ast.stmt] = []
    _reach(body, bound, found)
    return found


def _reach(body: Sequence[ast.stmt], bound: dict[str, ast.expr], found: list[ast.stmt]) -> bool:
    """Add what ``body`` surely runs to ``found``; False where it may stop early (what
    follows it is then not sure to run)."""
    for stmt in body:
        found.append(stmt)
        if isinstance(stmt, (ast.Return, ast.Raise, ast.Break, ast.Continue)):
            return False
        sure = (isinstance(stmt, ast.With) and all(_transparent(i) for i in stmt.items)) or (
            # a loop's first pass surely runs
            isinstance(stmt, ast.For)
            and not stmt.orelse
            and _literal_iterable(stmt.iter, bound)
            and not any(isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(stmt))
        )
        # a return inside a block may end the method there
        if sure and not _reach(stmt.body, bound, found):  # type: ignore[attr-defined]
            return False
    return True


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _tainted(method: ast.FunctionDef, entry: str) -> set[str]:
    """Names in ``method`` that hold what the solution produced or saw: assigned from an
    expression that calls the entry point or reads another such name, and the method's
    parameters (the mocks ``patch`` decorators pass in; a helper's arguments)."""
    names = {a.arg for a in method.args.args[1:]} | {entry}
    changed = True
    while changed:
        changed = False
        for node in ast.walk(method):
            targets: list[ast.expr] = []
            value: ast.AST | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets, value = [node.optional_vars], node.context_expr
            elif isinstance(node, ast.For):
                targets, value = [node.target], node.iter
            if value is None or not (_names_in(value) & names):
                continue
            for target in targets:
                new = _names_in(target) - names
                if new:
                    names |= new
                    changed = True
    return names


class _Finder:
    """The sites of a test source's methods, helper methods followed (a check in
    ``self._validate(result)`` runs whenever the method reaches that call)."""

    _DEPTH = 3

    def __init__(self, source: str, entry: str) -> None:
        self.text = _Text(source)
        self.entry = entry
        self.defs: dict[str, ast.FunctionDef] = {}
        twice: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        if item.name in self.defs:
                            twice.add(item.name)
                        self.defs[item.name] = item
        # the same name in two classes: which one a test reaches is not known here
        for name in twice:
            del self.defs[name]
        self.memo: dict[str, list[Site]] = {}

    def sites(self, name: str, depth: int = 0) -> list[Site]:
        if name in self.memo:
            return self.memo[name]
        method = self.defs.get(name)
        if method is None or depth > self._DEPTH:
            return []
        self.memo[name] = []  # a helper that calls itself adds nothing more
        found = self._own(method, depth)
        self.memo[name] = found
        return found

    def _own(self, method: ast.FunctionDef, depth: int) -> list[Site]:
        text, tainted = self.text, _tainted(method, self.entry)
        sites: list[Site] = []
        for stmt in _reached(method.body, _literal_bindings(method)):
            if isinstance(stmt, ast.Assert):
                sites += _assert_sites(method.name, stmt, text, tainted)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                call = stmt.value
                sites += _call_sites(method.name, call, text, tainted)
                func = call.func
                if (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "self"
                    and not func.attr.startswith(("assert", "fail"))
                ):
                    sites += self.sites(func.attr, depth + 1)
            elif isinstance(stmt, ast.With):
                for item in stmt.items:
                    made = item.context_expr
                    if isinstance(made, ast.Call) and _name_of(made.func) in _RAISES:
                        sites += _raises_sites(method.name, made, text)
        return sites


def _depends(node: ast.AST, tainted: set[str]) -> bool:
    return bool(_names_in(node) & tainted)


def _assert_sites(method: str, stmt: ast.Assert, text: _Text, tainted: set[str]) -> list[Site]:
    dependent = _depends(stmt.test, tainted)
    start, end = text.span(stmt.test)
    sites = [
        Site(
            method,
            stmt.lineno,
            "negation",
            "assert",
            dependent,
            (((start, start, "not ("), (end, end, ")")),),
        )
    ]
    test = stmt.test
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and (_is_literal(test.comparators[0]) or _is_literal(test.left))
    ):
        literal = test.comparators[0] if _is_literal(test.comparators[0]) else test.left
        choices = _value_choices([literal], text, far=False)
        if choices:
            sites.append(Site(method, stmt.lineno, "value", "assert ==", dependent, choices))
    return sites


def _call_sites(method: str, call: ast.Call, text: _Text, tainted: set[str]) -> list[Site]:
    name = _name_of(call.func)
    dependent = _depends(call, tainted)
    line = call.lineno
    sites: list[Site] = []
    args = call.args
    if name in _EQUALITY or name in _CLOSE:
        literals = [a for a in args[:2] if _is_literal(a)]
        if len(literals) == 1 and _tolerance_allows(call, name):
            choices = _value_choices(literals, text, far=name in _CLOSE)
            if choices:
                sites.append(Site(method, line, "value", name, dependent, choices))
    elif name in _MOCK_CALL:
        literals = [a for a in args if _is_literal(a)]
        literals += [k.value for k in call.keywords if k.arg and _is_literal(k.value)]
        choices = _value_choices(literals, text, far=False)
        if choices:
            sites.append(Site(method, line, "value", name, dependent, choices))
    elif name in ("assertIn", "assertNotIn") and len(args) >= 2:
        needle = args[0]
        if (
            name == "assertIn"
            and isinstance(needle, ast.Constant)
            and isinstance(needle.value, str)
            and len(needle.value) >= _MIN_NEEDLE
            and not _is_literal(args[1])
        ):
            sites.append(
                Site(method, line, "value", name, dependent, _value_choices([needle], text, False))
            )
    elif name in ("assertTrue", "assertFalse") and args:
        test = args[0]
        if (
            name == "assertTrue"
            and isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
            and _is_literal(test.comparators[0])
        ):
            choices = _value_choices([test.comparators[0]], text, far=False)
            if choices:
                sites.append(Site(method, line, "value", name + " ==", dependent, choices))
    elif name in _RAISES and args:
        sites += _raises_sites(method, call, text)
    opposite = _OPPOSITE.get(name)
    if opposite is not None and isinstance(call.func, ast.Attribute) and _self_or_mock(call):
        start, end = text.span(call.func)
        if text.source[end - len(name) : end] == name:
            swap = ((end - len(name), end, opposite),)
            sites.append(Site(method, line, "negation", name, dependent, (swap,)))
    return sites


def _self_or_mock(call: ast.Call) -> bool:
    """Whether a check is the test case's own (``self.assertX``) or a mock's; a module
    function of that name (``np.testing.assert_equal``) has no opposite to swap in."""
    func = call.func
    assert isinstance(func, ast.Attribute)
    if func.attr.startswith("assert_"):
        return not (isinstance(func.value, ast.Attribute) and func.value.attr == "testing")
    return isinstance(func.value, ast.Name) and func.value.id == "self"


def _tolerance_allows(call: ast.Call, name: str) -> bool:
    """A tolerance check may be moved only where its tolerance is a small literal."""
    if name not in _CLOSE:
        return True
    for kw in call.keywords:
        if kw.arg in ("delta", "rtol", "atol"):
            if not (_is_literal(kw.value) and isinstance(kw.value, ast.Constant)):
                return False
            if not isinstance(kw.value.value, (int, float)) or abs(kw.value.value) >= 0.25:
                return False
        elif kw.arg in ("places", "decimal"):
            if not (isinstance(kw.value, ast.Constant) and type(kw.value.value) is int):
                return False
            if kw.value.value < 1:
                return False
    return True


def _raises_sites(method: str, call: ast.Call, text: _Text) -> list[Site]:
    """``assertRaises(E)``: E moved to a builtin exception outside its family."""
    if not call.args:
        return []
    expected = call.args[0]
    family: type | None = None
    if isinstance(expected, ast.Name):
        found = getattr(builtins, expected.id, None)
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            return []
        family = found
    elif not isinstance(expected, ast.Attribute):
        return []
    others = [
        name
        for name in _OTHER_EXCEPTIONS
        if family is None
        or not (
            issubclass(getattr(builtins, name), family)
            or issubclass(family, getattr(builtins, name))
        )
    ]
    if not others:
        return []
    start, end = text.span(expected)
    choices = tuple(((start, end, name),) for name in others)
    # what is raised, the solution raised: such a check always reads the solution
    return [Site(method, call.lineno, "exception", _name_of(call.func), True, choices)]


def find_sites(source: str, methods: Sequence[str], entry_point: str) -> dict[str, list[Site]]:
    """Every site each named test method of ``source`` surely reaches, in its own body
    or in a helper method it calls (a site of a helper is listed under each method that
    reaches it, with the helper's name as :attr:`Site.method`).  Methods with none map
    to an empty list."""
    finder = _Finder(source, entry_point)
    return {name: list(finder.sites(name)) for name in methods}


# ----------------------------------------------------------------------------- mutants


def _draw(
    site: Site, choice: tuple[tuple[int, int, str], ...], text: _Text, rng: random.Random
) -> tuple[list[tuple[int, int, str]], str, str]:
    """The edits of one choice at a site (values drawn now), and what the check said
    before and says after.  No edits where the value cannot be changed."""
    edits: list[tuple[int, int, str]] = []
    for start, end, what in choice:
        if site.kind == "value":
            new = _new_literal(text.source[start:end], rng, far=what == "far")
            if new is None:
                return [], "", ""
        else:
            new = what
        edits.append((start, end, new))
    if site.kind == "value":
        start, end, new = edits[0]
        return edits, text.source[start:end], new
    if site.check == "assert":
        return edits, "assert", "assert not"
    start, end, new = edits[0]
    return edits, text.source[start:end], new


def make_mutants(
    source: str,
    methods: Sequence[str],
    entry_point: str,
    count: int,
    rng: random.Random,
) -> list[MutantTest]:
    """``count`` mutant copies of ``source``, each changing one site reached by every
    method of ``methods`` that reaches one (a different site in each copy where a method
    has several; a site depending on the solution first, a value change before another
    kind).  A site in a helper method changes every method that reaches it.  Empty
    where no method reaches a site."""
    sites = find_sites(source, methods, entry_point)
    text = _Text(source)
    order: dict[str, list[Site]] = {}
    for method in sorted(sites):
        if not sites[method]:
            continue
        shuffled = list(sites[method])
        rng.shuffle(shuffled)
        # what depends on the solution and changes a value catches the most forgeries
        shuffled.sort(key=lambda s: (not s.dependent, s.kind != "value"))
        order[method] = shuffled
    mutants: list[MutantTest] = []
    for n in range(count):
        chosen: dict[int, tuple[Site, list[tuple[int, int, str]], str, str]] = {}
        for candidates in order.values():
            if any(id(site) in chosen for site in candidates):
                continue  # a helper it reaches is changed already
            for attempt in range(len(candidates)):
                site = candidates[(n + attempt) % len(candidates)]
                edits, before, after = _draw(site, rng.choice(site.choices), text, rng)
                if edits:
                    chosen[id(site)] = (site, edits, before, after)
                    break
        if not chosen:
            continue
        mutations = []
        for method in methods:
            hit = next((chosen[id(s)] for s in sites.get(method, ()) if id(s) in chosen), None)
            if hit is not None:
                site, _, before, after = hit
                mutations.append(Mutation(method, site.line, site.kind, site.check, before, after))
        mutated = _apply(source, [e for _, edits, _, _ in chosen.values() for e in edits])
        try:
            ast.parse(mutated)
        except SyntaxError:  # a change the text could not hold: this copy is not used
            continue
        mutants.append(MutantTest(mutated, tuple(mutations)))
    return mutants


def _apply(source: str, edits: list[tuple[int, int, str]]) -> str:
    out = source
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + new + out[end:]
    return out
