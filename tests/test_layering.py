"""The floors of ARCHITECTURE.md, checked on the source of every module of ``conductor``.

- No import circle between modules, anywhere in the package.
- No circle between units: a package (``conductor.conductors``) or a top-level module
  (``conductor.pool``) taken as one node, so that two modules of one package importing
  two modules of another, and back, count as a circle even when the modules do not.
- No module imports from a floor above its own.
- No module imports another module's ``_private`` name, and no ``_private`` module is
  imported from outside its package (``sandbox/__init__.py`` importing
  ``sandbox/_engine.py`` is the package's own business).
- ``conductor.llm`` imports nothing outside itself but its leaves.

The graph is read from the source with ``ast`` (every import counts: at module level,
inside functions and under ``TYPE_CHECKING``), plus the client registry's entries, which
:mod:`conductor.llm.factory` imports by name.  The documented exceptions are the one
table :data:`EXCEPTIONS`, which the circle and floor checks honour (a private name has
no exception: make it public or move it).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import conductor

PACKAGE = Path(conductor.__file__).parent

#: What a module imports: (the module imported from, the name taken or None) pairs.
Imports = Mapping[str, list[tuple[str, str | None]]]

#: ARCHITECTURE.md's floors, bottom up: a module imports only from its own floor and the
#: floors below it.  Each names the units (``conductor.NAME``, a package or a module) on it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("words and errors", ("errors", "text", "events", "private", "userfiles", "bounds")),
    ("configuration", ("targets", "configfile", "shipped", "redact", "pool", "benchmark")),
    ("model calls", ("llm",)),
    ("the Conductor", ("conductors",)),
    # The workflow type (the three lists, parsed from a reply or read from a record)
    # sits with the records that hold it.
    ("records", ("workflow", "record", "shapes", "runs")),
    # A record as OpenTelemetry spans: read from records, handed records by bench and
    # serve.
    ("traces", ("otel",)),
    ("the method", ("grammar", "context", "steps", "execute", "pool_check")),
    ("sandbox", ("sandbox",)),
    ("grading", ("grading",)),
    ("datasets", ("datasets",)),
    # A router reads bench run directories and question keys; strategies run it.
    ("routing", ("router",)),
    ("strategies", ("strategies",)),
    ("benchmarks", ("bench",)),
    ("training", ("train",)),
    ("presentation", ("render", "cli", "serve", "view")),
]

#: Units outside the floors, and why.
OUTSIDE = {
    "conductor": "the public API: re-exports from every floor (lazily for the heavy ones)",
    "conductor.__main__": "``python -m conductor``: the CLI's entry point",
    "conductor.testing": "the fake LLM servers the tests and benchmarks script; no module "
    "of the package imports them",
}

#: The documented exceptions, (importer, imported) each a unit, package or module prefix,
#: and why.  The floor and circle checks let these edges pass; a stale entry fails.
#: None today: the last one (bench asking the training floor's guard what a checkpoint
#: was trained on) went when question identity moved to ``datasets/questions.py`` and the
#: checkpoint's trained questions to ``bench/trained.py``.
EXCEPTIONS: dict[tuple[str, str], str] = {}

#: Modules outside ``conductor.llm`` that it may import, and why: the exception
#: hierarchy, the text helpers, the private files, what a call is aimed at
#: (``targets``: Worker, Price, the client kinds) and the redaction of credentials in
#: URLs (``redact``, which imports only ``targets``), for labels that name an endpoint,
#: and the files the user names (``userfiles``, which imports only ``errors`` and
#: ``text``): a model file's path resolved, a looping link one sentence.
LEAVES = {
    "conductor.errors",
    "conductor.text",
    "conductor.targets",
    "conductor.private",
    "conductor.redact",
    "conductor.userfiles",
}


# --- reading the graph --------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in ``path``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:  # ``from . import x`` names a module
                    yield sub, None
                else:
                    yield source, alias.name


def registry_edges() -> dict[str, set[str]]:
    """The client and batch API modules :mod:`conductor.llm.factory` imports through its
    registries."""
    factory = importlib.import_module("conductor.llm.factory")
    clients: dict[str, tuple[str, str]] = getattr(factory, "CLIENTS", {})
    batch_apis: dict[str, tuple[str, str]] = getattr(factory, "BATCH_APIS", {})
    entries = [*clients.values(), *batch_apis.values()]
    return {
        "conductor.llm.factory": {
            importlib.util.resolve_name(module, "conductor.llm") for module, _ in entries
        }
    }


def is_ours(target: str) -> bool:
    return target == "conductor" or target.startswith("conductor.")


def package_imports() -> dict[str, list[tuple[str, str | None]]]:
    """Every module of ``conductor`` and what it imports from ``conductor``."""
    modules = all_modules()
    known = set(modules)
    out = {
        name: [(t, what) for t, what in imports_of(name, path, known) if is_ours(t)]
        for name, path in modules.items()
    }
    for name, targets in registry_edges().items():
        out[name].extend((target, None) for target in targets)
    return out


def llm_imports() -> dict[str, list[tuple[str, str | None]]]:
    """Each module of ``conductor.llm`` and what it imports from ``conductor``."""
    return {
        name: targets
        for name, targets in package_imports().items()
        if name == "conductor.llm" or name.startswith("conductor.llm.")
    }


# --- the checks, on any graph (the tests below feed them small ones too) -------------


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def unit_of(module: str) -> str:
    """The package or top-level module ``module`` belongs to: ``conductor.X``."""
    return ".".join(module.split(".")[:2])


def excepted(importer: str, target: str, exceptions: Mapping[tuple[str, str], str]) -> bool:
    return any(within(importer, a) and within(target, b) for a, b in exceptions)


def module_graph(
    imports: Imports, exceptions: Mapping[tuple[str, str], str] = EXCEPTIONS
) -> dict[str, set[str]]:
    return {
        name: {t for t, _ in targets if t != name and not excepted(name, t, exceptions)}
        for name, targets in imports.items()
    }


def unit_graph(
    imports: Imports, exceptions: Mapping[tuple[str, str], str] = EXCEPTIONS
) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, targets in module_graph(imports, exceptions).items():
        edges = graph.setdefault(unit_of(name), set())
        edges.update(unit_of(t) for t in targets if unit_of(t) != unit_of(name))
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (or a self-import), by
    Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def floor_of(module: str, floors: list[tuple[str, tuple[str, ...]]] = FLOORS) -> int | None:
    parts = module.split(".")
    for level, (_, names) in enumerate(floors):
        if len(parts) > 1 and parts[1] in names:
            return level
    return None


def climbing(
    imports: Imports,
    floors: list[tuple[str, tuple[str, ...]]] = FLOORS,
    exceptions: Mapping[tuple[str, str], str] = EXCEPTIONS,
) -> list[str]:
    """Every import of a module from a floor above its own."""
    return sorted(
        f"{name} ({floors[low][0]}) imports {target} ({floors[high][0]})"
        for name, targets in imports.items()
        if (low := floor_of(name, floors)) is not None
        for target, _ in targets
        if (high := floor_of(target, floors)) is not None
        and high > low
        and not excepted(name, target, exceptions)
    )


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(imports: Imports) -> list[str]:
    """Every import of another module's ``_private`` name, and of a ``_private`` module
    from outside the package holding it."""
    found: set[str] = set()
    for name, targets in imports.items():
        for target, what in targets:
            if what is not None and is_private(what):
                found.add(f"{name} imports {target}.{what}")
            parts = target.split(".")
            for i, part in enumerate(parts):
                home = ".".join(parts[:i])
                if is_private(part) and not within(name, home):
                    found.add(f"{name} imports {target}, private to {home}")
    return sorted(found)


# --- the checker is not blind ---------------------------------------------------------


def test_the_graph_sees_the_imports_it_should() -> None:
    """The reader finds imports known to exist, of every form."""
    imports = package_imports()
    assert ("conductor.errors", "ModelCallError") in imports["conductor.llm.caller"]
    assert ("conductor.llm.retry", "send_with_retries") in imports["conductor.llm.caller"]
    assert ("conductor.llm.openai_client", None) in imports["conductor.llm.factory"]
    # A relative import of the package itself, and one inside a function.
    assert ("conductor", "__version__") in imports["conductor.cli.app"]
    assert any(t == "conductor.sandbox._engine" for t, _ in imports["conductor.sandbox"])


def test_every_import_names_a_module_that_exists() -> None:
    known = set(all_modules())
    unknown = sorted(
        f"{name} imports {target}"
        for name, targets in package_imports().items()
        for target, _ in targets
        if target not in known
    )
    assert unknown == []


def test_tarjan_finds_circles_and_only_circles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]] and cycles({"a": {"b"}, "b": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_a_circle_of_three_modules_is_found() -> None:
    imports: Imports = {
        "conductor.p.a": [("conductor.p.b", "x")],
        "conductor.p.b": [("conductor.p.c", None)],
        "conductor.p.c": [("conductor.p.a", "y")],
    }
    assert cycles(module_graph(imports, {})) == [
        ["conductor.p.a", "conductor.p.b", "conductor.p.c"]
    ]


def test_a_circle_between_packages_is_found_where_the_modules_make_none() -> None:
    # a.one -> b.one, b.two -> a.two: no module circle, but the packages a and b.
    imports: Imports = {
        "conductor.a.one": [("conductor.b.one", "f")],
        "conductor.a.two": [],
        "conductor.b.one": [],
        "conductor.b.two": [("conductor.a.two", "g")],
        "conductor.m": [("conductor.a", "h")],
    }
    assert cycles(module_graph(imports, {})) == []
    assert cycles(unit_graph(imports, {})) == [["conductor.a", "conductor.b"]]
    # A documented exception removes the edge, and with it the circle.
    assert cycles(unit_graph(imports, {("conductor.b", "conductor.a.two"): "why"})) == []


def test_an_upward_import_is_found() -> None:
    floors = [("low", ("low",)), ("high", ("high",))]
    imports: Imports = {
        "conductor.low.x": [("conductor.high", "up")],
        "conductor.high": [("conductor.low.x", "down")],
        "conductor.lowly": [("conductor.high", "up")],  # no floor: not checked
    }
    assert climbing(imports, floors, {}) == ["conductor.low.x (low) imports conductor.high (high)"]
    assert climbing(imports, floors, {("conductor.low", "conductor.high"): "why"}) == []


def test_a_private_import_is_found() -> None:
    imports: Imports = {
        "conductor.a": [("conductor.b", "_helper"), ("conductor.b", "helper")],
        "conductor.b": [("conductor", "__version__")],
        "conductor.pkg": [("conductor.pkg._engine", "Engine")],  # its own private module
        "conductor.pkg.mod": [("conductor.pkg._engine", None)],
        "conductor.other": [("conductor.pkg._engine", "Engine")],
    }
    assert private_imports(imports) == [
        "conductor.a imports conductor.b._helper",
        "conductor.other imports conductor.pkg._engine, private to conductor.pkg",
    ]


# --- the package ------------------------------------------------------------------------


def test_no_import_circle_between_modules() -> None:
    assert cycles(module_graph(package_imports())) == []


def test_no_import_circle_between_packages_and_top_level_modules() -> None:
    assert cycles(unit_graph(package_imports())) == []


def test_every_module_has_a_floor() -> None:
    homeless = sorted(m for m in all_modules() if floor_of(m) is None and unit_of(m) not in OUTSIDE)
    assert homeless == []


def test_no_floor_imports_a_floor_above_it() -> None:
    assert climbing(package_imports()) == []


def test_nothing_in_the_package_imports_its_test_kit() -> None:
    importers = sorted(
        name
        for name, targets in package_imports().items()
        if unit_of(name) != "conductor.testing"
        and any(within(t, "conductor.testing") for t, _ in targets)
    )
    assert importers == []


def stale_exceptions(imports: Imports, exceptions: Mapping[tuple[str, str], str]) -> list[str]:
    """The entries of an exceptions table that give no reason, or that no import needs
    any more (an exception outliving its import would let the next one pass unseen)."""
    stale: list[str] = []
    for (a, b), why in exceptions.items():
        if not why.strip():
            stale.append(f"{a} -> {b}: no reason given")
        elif not any(
            within(name, a) and within(t, b)
            for name, targets in imports.items()
            for t, _ in targets
        ):
            stale.append(f"no import of {b} from {a} is left: drop the exception")
    return stale


def test_every_documented_exception_is_still_needed() -> None:
    assert stale_exceptions(package_imports(), EXCEPTIONS) == []


def test_a_stale_or_unexplained_exception_is_named() -> None:
    """The table is empty today, so the test above reads nothing: here the same check
    is given one entry an import needs, one no import needs and one without a reason."""
    table = {
        ("conductor.cli", "conductor.render"): "cli renders (an import that exists)",
        ("conductor.errors", "conductor.cli"): "an import nobody makes",
        ("conductor.cli", "conductor.llm"): " ",
    }
    assert stale_exceptions(package_imports(), table) == [
        "no import of conductor.cli from conductor.errors is left: drop the exception",
        "conductor.cli -> conductor.llm: no reason given",
    ]


def test_no_module_imports_a_private_name_or_another_packages_private_module() -> None:
    assert private_imports(package_imports()) == []


# --- the model-call layer ------------------------------------------------------------------


def test_no_import_circle_inside_the_model_call_layer() -> None:
    imports = llm_imports()
    graph = {
        name: {t for t, _ in targets if t.startswith("conductor.llm.")}
        for name, targets in imports.items()
    }
    assert cycles(graph) == []


def test_no_import_climbs_up_out_of_the_model_call_layer() -> None:
    above = [unit for _, names in FLOORS[3:] for unit in names]
    found = sorted(
        f"{name} imports {target}" + (f".{what}" if what else "")
        for name, targets in llm_imports().items()
        for target, what in targets
        if any(within(target, f"conductor.{unit}") for unit in above)
    )
    assert found == []


def test_the_model_call_layer_imports_only_its_leaves() -> None:
    outside = sorted(
        f"{name} imports {target}" + (f".{what}" if what else "")
        for name, targets in llm_imports().items()
        for target, what in targets
        if not within(target, "conductor.llm") and target not in LEAVES
    )
    assert outside == []


def test_no_client_imports_the_factory() -> None:
    """The clients take what they share from the modules below them: nothing a client
    imports, directly or not, imports the factory.  The modules that ask the registry
    about a kind's capabilities (keys, prefill, cost, limits, the caller, the answer
    format's check of who can answer) sit above."""
    imports = llm_imports()
    graph = {name: {t for t, _ in targets} for name, targets in imports.items()}
    below: set[str] = set()
    todo = list(registry_edges()["conductor.llm.factory"])
    while todo:
        name = todo.pop()
        if name not in below:
            below.add(name)
            todo.extend(t for t in graph.get(name, ()) if t.startswith("conductor.llm."))
    assert sorted(m for m in below if "conductor.llm.factory" in graph.get(m, ())) == []
    importers = sorted(m for m, targets in graph.items() if "conductor.llm.factory" in targets)
    assert importers == [
        "conductor.llm.answer_format",
        "conductor.llm.batching",
        "conductor.llm.caller",
        "conductor.llm.cost",
        "conductor.llm.keys",
        "conductor.llm.limiter",
        "conductor.llm.prefill",
    ]


ARCHITECTURE = PACKAGE.parent.parent / "ARCHITECTURE.md"


def architecture_floors() -> list[tuple[str, tuple[str, ...]]]:
    """The floors table of ARCHITECTURE.md: (floor, its units as ``conductor.NAME``
    names) per row, bottom up."""
    rows = []
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("floor", "") or set(cells[0]) <= {"-"}:
            continue
        units = tuple(
            u.removesuffix(".py").removesuffix("/") for u in re.findall(r"`([^`]+)`", cells[1])
        )
        rows.append((cells[0], units))
    return rows


def test_architecture_md_draws_the_floors_this_test_checks() -> None:
    assert architecture_floors() == FLOORS
