"""The floors of ARCHITECTURE.md, checked on the source of every module of ``conductor``.

- No import circle between modules, anywhere in the package.
- No circle between units: a package (``conductor.conductors``) or a top-level module
  (``conductor.pool``) taken as one node, so that two modules of one package importing
  two modules of another, and back, count as a circle even when the modules do not.
- No module imports from a floor above its own.
- No module imports another module's ``_private`` name, and no ``_private`` module is
  imported from outside its package (``sandbox/__init__.py`` importing
  ``sandbox/_engine.py`` is the package's own business).
- ``conductor.llm`` imports nothing outside itself but its leaves and the local-model
  runtime; the runtime (``conductor.localmodel``) imports nothing of the model calls; the
  batch APIs (``conductor.batches``) are reached only through their registry.

The graph is read from the source with ``ast`` (every import counts: at module level,
inside functions and under ``TYPE_CHECKING``), plus the entries of every registry that
imports modules by name, found by its shape (:func:`registry_targets`): the client
kinds of :mod:`conductor.llm.factory`, the batch protocols of :mod:`conductor.batches`,
the llama.cpp bindings of :mod:`conductor.localmodel.runtimes` and the graders of
:mod:`conductor.grading`.  The documented exceptions are the one table
:data:`EXCEPTIONS`, which the circle and floor checks honour (a private name has no
exception: make it public or move it).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import conductor

PACKAGE = Path(conductor.__file__).parent

#: What a module imports: (the module imported from, the name taken or None) pairs.
Imports = Mapping[str, list[tuple[str, str | None]]]

#: ARCHITECTURE.md's floors, bottom up: a module imports only from its own floor and the
#: floors below it.  Each names the units (``conductor.NAME``, a package or a module) on it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("words and errors", ("errors", "text", "events", "private", "userfiles", "bounds")),
    ("configuration", ("targets", "configfile", "shipped", "redact", "pool", "benchmark")),
    # GGUF models in host processes: the local client and the router's features use it.
    ("local models", ("localmodel",)),
    ("model calls", ("llm",)),
    # The batch APIs build their lines with the clients' own builders; the caller knows
    # the batcher only through a protocol of its own (llm/batcher.py).
    ("provider batches", ("batches",)),
    # What processes on several hosts share (the call cache's entries on a server):
    # it stores what llm/ decides to keep, and knows nothing of runs.
    ("shared state", ("state",)),
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
    # Where work runs beyond this process (a Ray cluster): it runs graders and
    # strategies, and the benchmark runner places its work there.
    ("placement", ("placement",)),
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

#: Packages outside ``conductor.llm`` that it may import, and why: the local-model
#: runtime, which ``client: local``'s client runs its calls on.
LEAF_PACKAGES = {"conductor.localmodel"}

#: What the local-model runtime may import outside itself: the exception hierarchy, the
#: private files and where the cache lives (the crashes it remembers), the masking of
#: secrets (a model path in a crash record), the files the user names (a model file's
#: path resolved) and what a call is aimed at (a worker, the local Conductor).
LOCALMODEL_LEAVES = {
    "conductor.errors",
    "conductor.private",
    "conductor.redact",
    "conductor.userfiles",
    "conductor.targets",
}


# --- reading the graph --------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, read once per test session (every check walks them all)."""
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def _import_statements(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements of ``path``: most tests here read every module's, and
    walking the trees was most of this file's time."""
    return tuple(n for n in ast.walk(parsed(path)) if isinstance(n, (ast.Import, ast.ImportFrom)))


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in ``path``."""
    is_package = path.name == "__init__.py"
    for node in _import_statements(path):
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


def _first_string(node: ast.expr) -> str | None:
    """The first item of a tuple, or the first argument of a call, when it is a string."""
    items = node.elts if isinstance(node, ast.Tuple) else None
    items = node.args if isinstance(node, ast.Call) else items
    if items and isinstance(items[0], ast.Constant) and isinstance(items[0].value, str):
        return items[0].value
    return None


def registry_targets(source: str | ast.Module, package: str) -> set[str]:
    """The modules the registries of a module's ``source`` import by name: each
    module-level dict whose every value starts with a relative module name, as a tuple
    (``"openai": (".openai_client", "OpenAIClient")``) or as a call's first argument
    (``_Entry(".runtime_cyllama", ...)``), resolved in ``package``."""
    found: set[str] = set()
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Dict) or not value.values:
            continue
        names = [_first_string(v) for v in value.values]
        if all(n is not None and n.startswith(".") for n in names):
            found.update(importlib.util.resolve_name(n, package) for n in names if n)
    return found


def registry_edges() -> dict[str, set[str]]:
    """Each module holding a registry, and the modules its registries import by name."""
    edges: dict[str, set[str]] = {}
    for name, path in all_modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = registry_targets(parsed(path), package)
        if targets:
            edges[name] = targets
    return edges


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


def imports_within(package: str) -> dict[str, list[tuple[str, str | None]]]:
    """Each module of ``package`` and what it imports from ``conductor``."""
    return {name: targets for name, targets in package_imports().items() if within(name, package)}


def llm_imports() -> dict[str, list[tuple[str, str | None]]]:
    """Each module of ``conductor.llm`` and what it imports from ``conductor``."""
    return imports_within("conductor.llm")


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
    assert ("conductor.batches.openai", None) in imports["conductor.batches"]
    assert ("conductor.localmodel.runtime_cyllama", None) in imports[
        "conductor.localmodel.runtimes"
    ]
    assert ("conductor.localmodel.runtimes", "choose_runtime") in imports[
        "conductor.localmodel.crashes"
    ]
    # A relative import of the package itself, and one inside a function.
    assert ("conductor", "__version__") in imports["conductor.cli.app"]
    assert any(t == "conductor.sandbox._engine" for t, _ in imports["conductor.sandbox"])


def test_every_registry_is_found_by_its_shape() -> None:
    """The four registries that import by name, and only they, with every entry."""
    edges = registry_edges()
    assert sorted(edges) == [
        "conductor.batches",
        "conductor.grading",
        "conductor.llm.factory",
        "conductor.localmodel.runtimes",
    ]
    clients = importlib.import_module("conductor.llm.factory").CLIENTS
    assert edges["conductor.llm.factory"] == {
        importlib.util.resolve_name(module, "conductor.llm") for module, _ in clients.values()
    }
    assert len(edges["conductor.llm.factory"]) == 7
    assert len(edges["conductor.grading"]) == 4
    assert len(edges["conductor.batches"]) == 3
    assert len(edges["conductor.localmodel.runtimes"]) == 2
    # The shapes it takes, and what it leaves.
    source = (
        'A = {"x": (".one", "One"), "y": (".two", "Two")}\n'
        'B: dict[str, E] = {"z": E("..up.three", "t")}\n'
        'C = {"n": ("not-a-module", 1)}\n'
        'D = {"m": (".four", 1), "k": ("plain", 2)}\n'
        "def f():\n    E = {'q': ('.five', 1)}\n"
    )
    assert registry_targets(source, "conductor.p") == {
        "conductor.p.one",
        "conductor.p.two",
        "conductor.up.three",
    }


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


# --- the model-call layer and the rooms beside it ------------------------------------------


def outside_imports(
    imports: Imports,
    package: str,
    leaves: set[str],
    leaf_packages: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    """Every import by a module of ``package`` of a module outside it that is neither one
    of ``leaves`` nor inside one of ``leaf_packages``."""
    return sorted(
        f"{name} imports {target}" + (f".{what}" if what else "")
        for name, targets in imports.items()
        if within(name, package)
        for target, what in targets
        if not within(target, package)
        and target not in leaves
        and not any(within(target, p) for p in leaf_packages)
    )


@pytest.mark.parametrize("package", ["conductor.llm", "conductor.localmodel", "conductor.batches"])
def test_no_import_circle_inside_the_package(package: str) -> None:
    imports = imports_within(package)
    assert len(imports) > 5
    graph = {
        name: {t for t, _ in targets if within(t, package)} for name, targets in imports.items()
    }
    assert cycles(graph) == []


def test_no_import_climbs_up_out_of_the_model_call_layer() -> None:
    level = [floor for floor, _ in FLOORS].index("model calls")
    above = [unit for _, names in FLOORS[level + 1 :] for unit in names]
    assert "batches" in above and "llm" not in above
    found = sorted(
        f"{name} imports {target}" + (f".{what}" if what else "")
        for name, targets in llm_imports().items()
        for target, what in targets
        if any(within(target, f"conductor.{unit}") for unit in above)
    )
    assert found == []


def test_the_model_call_layer_imports_only_its_leaves() -> None:
    assert outside_imports(package_imports(), "conductor.llm", LEAVES, LEAF_PACKAGES) == []


def test_the_local_model_runtime_imports_only_its_leaves() -> None:
    """The runtime knows nothing of the model calls: a client, a cache, a caller."""
    found = outside_imports(package_imports(), "conductor.localmodel", LOCALMODEL_LEAVES)
    assert found == []


def test_a_layer_reaching_past_its_leaves_is_found() -> None:
    imports: Imports = {
        "conductor.localmodel.crashes": [
            ("conductor.private", "default_cache_dir"),
            ("conductor.llm.cache", "default_cache_dir"),
        ],
        "conductor.llm.local_client": [("conductor.localmodel.models", "get_host")],
    }
    assert outside_imports(imports, "conductor.localmodel", LOCALMODEL_LEAVES) == [
        "conductor.localmodel.crashes imports conductor.llm.cache.default_cache_dir"
    ]
    assert outside_imports(imports, "conductor.llm", LEAVES, LEAF_PACKAGES) == []
    assert outside_imports(imports, "conductor.llm", LEAVES) == [
        "conductor.llm.local_client imports conductor.localmodel.models.get_host"
    ]


def test_the_batch_apis_are_reached_only_through_their_registry() -> None:
    """As the clients are through the factory: only ``conductor.batches``' registry
    imports a protocol's module, and nothing those modules import, directly or not,
    imports the registry (which would make a circle through it)."""
    imports = package_imports()
    apis = registry_edges()["conductor.batches"]
    assert apis == {
        "conductor.batches.openai",
        "conductor.batches.anthropic",
        "conductor.batches.google",
    }
    importers = sorted(name for name, targets in imports.items() for t, _ in targets if t in apis)
    assert importers == ["conductor.batches"] * len(apis)
    graph = {name: {t for t, _ in targets} for name, targets in imports.items()}
    below: set[str] = set()
    todo = list(apis)
    while todo:
        name = todo.pop()
        if name not in below:
            below.add(name)
            todo.extend(graph.get(name, ()))
    assert sorted(m for m in below if "conductor.batches" in graph.get(m, ())) == []


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
        "conductor.llm.batcher",
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


# --- what runs inside the sandbox ----------------------------------------------------------

#: The files that run inside a sandbox, assembled into its driver: the sandbox's own and
#: the code grader's job drivers (each package's ``__init__`` runs in the parent).
INSIDE = ("conductor.sandbox.inside", "conductor.grading.drivers")


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def inside_imports(source: str) -> tuple[list[str], list[str]]:
    """(modules imported at run time, modules imported under ``if TYPE_CHECKING:``)."""
    run: list[str] = []
    typing_only: list[str] = []

    def visit(nodes: list[ast.stmt], into: list[str]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and is_type_checking(node.test):
                visit(node.body, typing_only)
                visit(node.orelse, into)
                continue
            if isinstance(node, ast.Import):
                into.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                into.append("." * node.level + (node.module or ""))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit([n for n in inner if isinstance(n, ast.stmt)], into)
                    for handler in inner:
                        if isinstance(handler, ast.ExceptHandler):
                            visit(handler.body, into)

    visit(ast.parse(source).body, run)
    return run, typing_only


def inside_problems(name: str, source: str) -> list[str]:
    """What keeps a file from running inside a sandbox as part of its driver: a run-time
    import of anything but the standard library (``conductor`` is not importable there,
    nor, for certain, anything else), or a type checker's import of anything but the
    files it is assembled with (the one namespace it joins): the sandbox's own driver
    and the other files of its package."""
    run, typing_only = inside_imports(source)
    package = name.rsplit(".", 1)[0]
    found = [
        f"{name} imports {module} at run time"
        for module in run
        if module.startswith(".") or module.split(".")[0] not in sys.stdlib_module_names
    ]
    found += [
        f"{name} imports {module} for the type checker"
        for module in typing_only
        if not (within(module, "conductor.sandbox.inside") or within(module, package))
    ]
    return found


def test_the_inside_check_sees_what_would_break_a_driver() -> None:
    source = (
        "from __future__ import annotations\nimport os\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from conductor.sandbox.inside.driver import CFG\n"
        "def f() -> None:\n    import json\n    try:\n        import numpy\n"
        "    except ImportError:\n        from conductor.grading import code\n"
    )
    assert inside_imports(source) == (
        ["__future__", "os", "typing", "json", "numpy", "conductor.grading"],
        ["conductor.sandbox.inside.driver"],
    )
    assert inside_problems("m", source) == [
        "m imports numpy at run time",
        "m imports conductor.grading at run time",
    ]
    wrong = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from conductor import text\n"
    assert inside_problems("p.m", wrong) == ["p.m imports conductor for the type checker"]
    sibling = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.n import f\n"
    assert inside_problems("p.m", sibling) == []


def test_what_runs_inside_imports_only_the_standard_library() -> None:
    files = {
        name: path
        for name, path in all_modules().items()
        if any(within(name, top) and name != top for top in INSIDE)
    }
    assert {"conductor.sandbox.inside.driver", "conductor.grading.drivers.bcb"} <= set(files)
    found = [
        problem
        for name, path in sorted(files.items())
        for problem in inside_problems(name, path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_the_sandbox_imports_nothing_from_grading() -> None:
    """The sandbox knows no benchmark: the graders bring their job drivers to it."""
    found = sorted(
        f"{name} imports {target}"
        for name, targets in package_imports().items()
        if within(name, "conductor.sandbox")
        for target, _ in targets
        if within(target, "conductor.grading")
    )
    assert found == []
