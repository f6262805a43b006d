"""What may reach a BigCodeBench test's checks: the walk of the values the entry point
returns and the assertions compare, and the rules of which classes are trusted
(standard library only; part of the BigCodeBench driver, :mod:`.bcb`, whose doc says how
a test is judged).

A value is refused when it holds an object of a class the solution made that defines
comparison, truth or other behaviour, a library object with a method of the solution's
set on the instance, or a mock the solution made; lists, tuples, sets, dicts, deques,
numpy object arrays, pandas values, index and columns, and instance attributes are
walked, plain values in C loops.  What the walk calls is read through ``type``'s own
descriptors: no object of the solution's is asked anything.
"""

from __future__ import annotations

import contextlib
import sys
import types
from itertools import compress
from operator import not_
from typing import Any

# Dunders a class created by the solution may define on an object it returns; anything
# else (comparisons, truth, length, attribute hooks, ...) could make a test's check pass
# without the right answer.
_PLAIN_DUNDERS = frozenset(
    {
        "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__init__",
        "__slots__", "__annotations__", "__firstlineno__", "__static_attributes__",
        "__repr__", "__str__", "__orig_bases__", "__parameters__", "__classcell__",
    }
)  # fmt: skip
# Objects a walk inspects (plain values are skipped in C loops and not counted): more
# than this and the value is refused rather than passed unchecked, since a rigged object
# behind that many others would otherwise reach the test.
_WALK_LIMIT = 2_000_000
_PLAIN = frozenset({int, float, str, bytes, bool, complex, type(None)})
# mocks the test's own code made, by id (:func:`_mock_init`); the object is kept so that
# an id is never reused for another
MOCKS_OF_THE_TEST: dict[int, Any] = {}
FUNCTION_TYPE = types.FunctionType
METHOD_TYPE = types.MethodType
MODULE_TYPE = types.ModuleType
# what a C type's own slots, methods and attributes are in its class dict
_C_SLOTS = (
    type(object.__eq__),  # wrapper_descriptor
    type(str.join),  # method_descriptor
    type(types.FunctionType.__dict__["__code__"]),  # getset_descriptor
    type(types.FunctionType.__dict__["__globals__"]),  # member_descriptor
)


def mro_of(t: type) -> tuple[type, ...]:
    # read through type's own descriptor: a metaclass of the solution's is never asked
    return tuple(type.__dict__["__mro__"].__get__(t))


def class_dict(t: type) -> Any:
    return type.__dict__["__dict__"].__get__(t)


# What :func:`untrusted` accepts, as a tuple (the solution can read it, not edit it):
# (class ids of the snapshot, trusted code ids, unittest.mock class ids, type of
# unittest.mock.ANY, whether the test itself uses ANY).
Rules = tuple[Any, ...]


def _class_problem(t: type, rules: Rules, strict: bool) -> str:
    """Why an object of class ``t`` may not be judged, or ``""``."""
    known, codes, _mocks, any_type, any_ok, lib_roots = rules
    mro = mro_of(t)
    if t is any_type:
        return "" if any_ok and not strict else "unittest.mock.ANY"
    if id(t) in known or made_by(t, codes) or library_class(t, lib_roots):
        return ""
    if id(type(t)) not in known:
        return "an object whose metaclass was made by the solution"
    if _c_level(mro, known):
        return ""
    for c in mro:
        if id(c) in known:
            if c is not object:
                return f"a {c.__name__} subclass made by the solution"
            continue
        for k, v in list(class_dict(c).items()):
            trusted = type(v) is FUNCTION_TYPE and id(v.__code__) in codes
            if type(k) is str and k.startswith("__") and k not in _PLAIN_DUNDERS and not trusted:
                return f"an object of a class made by the solution that defines {k}"
    return ""


def _c_level(mro: tuple[type, ...], known: frozenset[int]) -> bool:
    """Whether every class of ``mro`` made after the snapshot holds only C slots of its
    own, each under its own name (a Cython type a library made lazily: scipy's fused
    functions), and plain entries: no code of the solution's is behind any of it.  (A
    class statement always adds a Python function for each method it defines, and a
    slot moved to another name, ``__eq__ = int.__ne__``, is refused.)"""
    made = [c for c in mro if id(c) not in known]
    slots = 0
    for c in made:
        for k, v in list(class_dict(c).items()):
            if type(k) is not str or k in _PLAIN_DUNDERS or v is None:
                continue
            if type(v) not in _C_SLOTS or not any(b is v.__objclass__ for b in mro):
                return False
            if getattr(v, "__name__", None) != k:
                return False
            slots += 1
    return slots > 0


def made_by(t: type, codes: frozenset[int]) -> bool:
    """Whether every function of ``t`` (made after the snapshot) is trusted code (the
    test's own helper classes)."""
    fns = [v for v in class_dict(t).values() if type(v) is FUNCTION_TYPE]
    return bool(fns) and all(id(f.__code__) in codes for f in fns)


def library_class(t: type, roots: tuple[str, ...]) -> bool:
    """A class a library defined after the snapshot (a module it imports lazily): its
    module is a file under the interpreter's library directories and every function
    of it, and of its bases made after the snapshot, was compiled from a file there."""
    for c in mro_of(t):
        if c is object:
            continue
        # exact types only: the judge thread calls this, where no object of the
        # solution's may run (a rigged __module__ or a module with __getattr__)
        name = class_dict(c).get("__module__")
        module = sys.modules.get(name) if type(name) is str else None
        own = vars(module) if type(module) is MODULE_TYPE else {}
        path = own.get("__file__")
        if type(path) is not str or not path.startswith(roots):
            return False
        for v in list(class_dict(c).values()):
            # a library's decorators live in other files of it (matplotlib's
            # _api.deprecation): any library file, none the solution could name
            # (the guard refuses compiling under a library file's name)
            origin = v.__code__.co_filename if type(v) is FUNCTION_TYPE else path
            if type(origin) is not str or not origin.startswith(roots):
                return False
        if c is t:
            return True
    return False


def _is_mock(t: type, rules: Rules) -> bool:
    return any(id(c) in rules[2] for c in mro_of(t))


def untrusted(value: Any, rules: Rules, strict: bool, allowed: frozenset[int]) -> str:
    """Why ``value`` may not reach a test's checks, or ``""``.

    Walked: list, tuple, set, dict and deque contents (subclasses too, through the base
    type's own methods), numpy object arrays, pandas objects' values, index and
    columns, and instance ``__dict__`` values, all of it: plain values (numbers,
    strings) are passed over in C loops, and more than ``_WALK_LIMIT`` other objects
    is a refusal, not a pass.  Refused: see :func:`_class_problem`, and library objects
    with a function of the solution's set on the instance.  ``strict`` (the entry
    point's results) also refuses mocks; objects whose ids are in ``allowed`` (what the
    test passed in) pass.
    """
    todo = [value]
    seen: set[int] = set()
    while todo:
        x = todo.pop()
        t = type(x)
        if t in _PLAIN or id(x) in seen:
            continue
        seen.add(id(x))
        if len(seen) > _WALK_LIMIT:
            return f"a value of more than {_WALK_LIMIT:,} objects to check"
        if _is_mock(t, rules) and t is not rules[3]:
            # a mock the test made may come back (passed in, or made by the test's own
            # code that a patch calls); one the solution made answers whatever it is
            # asked (and is never walked: its children are mocks)
            if strict and id(x) not in allowed and not _test_made(x):
                return "a mock object"
            continue
        why = "" if id(x) in allowed else _class_problem(t, rules, strict)
        if why:
            return why
        mro = mro_of(t)
        if dict in mro:
            _push(todo, dict.keys(x))
            _push(todo, dict.values(x))
        elif list in mro or tuple in mro or set in mro or frozenset in mro:
            base = next(b for b in (list, tuple, set, frozenset) if b in mro)
            _push(todo, base.__iter__(x))
        elif t.__module__ == "collections" and t.__name__ == "deque":
            _push(todo, x)
        elif t.__module__ == "numpy" and t.__name__ == "ndarray":
            if x.dtype.kind == "O":
                _push(todo, x.ravel().tolist())
        elif str(t.__module__).startswith("pandas."):
            for part in ("index", "columns"):
                with contextlib.suppress(Exception):
                    todo.append(object.__getattribute__(x, part))
            with contextlib.suppress(Exception):
                arr = x.to_numpy()
                if arr.dtype.kind == "O":
                    _push(todo, arr.ravel().tolist())
        if t is FUNCTION_TYPE or isinstance(x, type):
            continue
        try:
            own = object.__getattribute__(x, "__dict__")
        except (AttributeError, TypeError):
            continue
        if type(own) is not dict:
            continue
        for k, v in list(own.items()):
            if type(v) in (FUNCTION_TYPE, METHOD_TYPE):
                fn = v.__func__ if type(v) is METHOD_TYPE else v
                shadows = type(k) is str and any(k in class_dict(c) for c in mro)
                # a method bound from a builtin (matplotlib keeps some) has no code:
                # the solution can make no builtin, so it is not the solution's
                if type(fn) is not FUNCTION_TYPE:
                    continue
                # a library module's own functions (a module's __dir__, a lazy
                # loader's __getattr__) are compiled from its file, which the solution
                # cannot name when it compiles (the guard)
                origin = fn.__code__.co_filename
                if type(origin) is str and origin.startswith(rules[5]):
                    continue
                if shadows and id(fn.__code__) not in rules[1]:
                    return f"a {t.__name__} whose {k} the solution replaced on the instance"
            else:
                todo.append(v)
    return ""


def _push(todo: list[Any], items: Any) -> None:
    """The items of a container that need a look (not plain values), in C loops: a list
    of ten million numbers costs what its type checks cost, not a Python loop."""
    got = list(items)
    todo.extend(compress(got, map(not_, map(_PLAIN.__contains__, map(type, got)))))


def reachable(values: Any) -> frozenset[int]:
    """ids of what the test passed to the entry point (a mock it made may come back)."""
    seen: set[int] = set()
    todo = [values]
    while todo and len(seen) < _WALK_LIMIT:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if type(x) in (list, tuple, set, frozenset):
            todo.extend(x)
        elif type(x) is dict:
            todo.extend(x.keys())
            todo.extend(x.values())
    return frozenset(seen)


def _test_made(mock: Any) -> bool:
    """Whether a mock (or the mock it is a child of) was made by the test's code."""
    seen = 0
    while mock is not None and seen < 64:
        if MOCKS_OF_THE_TEST.get(id(mock)) is mock:
            return True
        try:
            own = object.__getattribute__(mock, "__dict__")
        except (AttributeError, TypeError):
            return False
        parent = own.get("_mock_new_parent") if type(own) is dict else None
        mock = parent if parent is not None else own.get("_mock_parent")
        seen += 1
    return False
