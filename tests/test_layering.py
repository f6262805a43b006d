"""The floors of ARCHITECTURE.md, checked on the source: no module imports from a floor
above its own, no circle inside the model-call layer, and ``conductor.llm`` imports
nothing outside itself but its leaves.

The graph is read from the source with ``ast`` (every import counts: at module level,
inside functions and under ``TYPE_CHECKING``), plus the client registry's entries,
which :mod:`conductor.llm.factory` imports by name.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import conductor

PACKAGE = Path(conductor.__file__).parent

#: Floors above the model-call layer: ``conductor.llm`` imports none of them.
ABOVE = ("conductor.pool", "conductor.execute", "conductor.steps", "conductor.bench")
ABOVE += ("conductor.cli", "conductor.train", "conductor.conductors", "conductor.checkpoint_meta")
ABOVE += ("conductor.render",)

#: Modules outside ``conductor.llm`` that it may import, and why: the exception
#: hierarchy, the text helpers, and what a call is aimed at (``targets``: Worker, Price,
#: the client kinds).
LEAVES = {"conductor.errors", "conductor.text", "conductor.targets", "conductor.private"}


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
    """The client modules :mod:`conductor.llm.factory` imports through its registry."""
    factory = importlib.import_module("conductor.llm.factory")
    clients: dict[str, tuple[str, str]] = getattr(factory, "CLIENTS", {})
    return {
        "conductor.llm.factory": {
            importlib.util.resolve_name(module, "conductor.llm") for module, _ in clients.values()
        }
    }


def llm_imports() -> dict[str, list[tuple[str, str | None]]]:
    """Each module of ``conductor.llm`` and what it imports from ``conductor``."""
    modules = all_modules()
    known = set(modules)
    out: dict[str, list[tuple[str, str | None]]] = {}
    for name, path in modules.items():
        if name == "conductor.llm" or name.startswith("conductor.llm."):
            out[name] = [
                (target, what)
                for target, what in imports_of(name, path, known)
                if target == "conductor" or target.startswith("conductor.")
            ]
    for name, targets in registry_edges().items():
        out[name].extend((target, None) for target in targets)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a self-import)."""
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


def test_the_graph_sees_the_imports_it_should() -> None:
    """The reader is not blind: it finds imports known to exist, of every form."""
    imports = llm_imports()
    assert ("conductor.errors", "ModelCallError") in imports["conductor.llm.caller"]
    assert ("conductor.llm.retry", "send_with_retries") in imports["conductor.llm.caller"]
    assert ("conductor.llm.openai_client", None) in imports["conductor.llm.factory"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]] and cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_the_model_call_layer() -> None:
    imports = llm_imports()
    graph = {
        name: {t for t, _ in targets if t.startswith("conductor.llm.")}
        for name, targets in imports.items()
    }
    assert cycles(graph) == []


def test_no_import_climbs_up_out_of_the_model_call_layer() -> None:
    climbing = sorted(
        f"{name} imports {target}" + (f".{what}" if what else "")
        for name, targets in llm_imports().items()
        for target, what in targets
        if any(target == above or target.startswith(above + ".") for above in ABOVE)
    )
    assert climbing == []


def test_the_model_call_layer_imports_only_its_leaves() -> None:
    outside = sorted(
        f"{name} imports {target}" + (f".{what}" if what else "")
        for name, targets in llm_imports().items()
        for target, what in targets
        if not target.startswith("conductor.llm") and target not in LEAVES
    )
    assert outside == []


def test_no_client_imports_the_factory() -> None:
    """The clients take what they share from the modules below them: nothing a client
    imports, directly or not, imports the factory.  The modules that ask the registry
    about a kind's capabilities (keys, prefill, cost, limits, the caller) sit above."""
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
        "conductor.llm.caller",
        "conductor.llm.cost",
        "conductor.llm.keys",
        "conductor.llm.limiter",
        "conductor.llm.prefill",
    ]


#: ARCHITECTURE.md's floors, bottom up: a module imports only from its own floor and the
#: floors below it.  ``conductor`` itself (the lazy public API) and ``conductor.testing``
#: stand outside the floors.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("words and errors", ("errors", "text", "events", "private")),
    ("configuration", ("targets", "configfile", "shipped", "redact", "pool")),
    ("model calls", ("llm",)),
    ("the Conductor", ("conductors", "checkpoint_meta")),
    ("records", ("record", "shapes")),
    ("the method", ("workflow", "grammar", "context", "steps", "execute", "pool_check")),
    ("benchmarks", ("bench", "sandbox")),
    ("training", ("train",)),
    ("presentation", ("render", "cli", "serve", "view")),
]

#: The one documented exception: ``bench --exclude-trained`` asks the training floor's
#: held-out guard what a checkpoint was trained on.
ALLOWED_UP = {("conductor.bench", "conductor.train.contamination")}


def floor_of(module: str) -> int | None:
    for level, (_, names) in enumerate(FLOORS):
        for name in names:
            full = f"conductor.{name}"
            if module == full or module.startswith(full + "."):
                return level
    return None


def test_every_module_has_a_floor() -> None:
    outside = {"conductor", "conductor.__main__", "conductor.testing"}
    homeless = sorted(
        m
        for m in all_modules()
        if floor_of(m) is None and not any(m == o or m.startswith(o + ".") for o in outside)
    )
    assert homeless == []


def test_no_floor_imports_a_floor_above_it() -> None:
    modules = all_modules()
    known = set(modules)
    climbing = sorted(
        f"{name} ({FLOORS[low][0]}) imports {target} ({FLOORS[high][0]})"
        for name, path in modules.items()
        if (low := floor_of(name)) is not None
        for target, _ in imports_of(name, path, known)
        if (high := floor_of(target)) is not None
        and high > low
        and not any(name.startswith(a) and target == b for a, b in ALLOWED_UP)
    )
    assert climbing == []
