"""Every name the docs give exists, so that a moved module, a renamed option or a
deleted file fails a test instead of leaving a doc that lies.

Read: ARCHITECTURE.md, the README, docs/*.md, the docstrings and comments of src/ and
benchmarks/ and the test modules' own docstrings.  Checked there:

- **files and folders** (``llm/caller.py``, ``benchmarks/perf/grading.py``,
  ``tests/cases/grade_code.json``, a Markdown file cited in passing, a bare
  ``_spans.py`` in a passage that names ``otel/``): the file exists.  A path is ours
  when it starts in a folder of the repository or of ``src/conductor`` (``vllm/...`` is
  another project's); a bare data-file name (``samples.jsonl``) that is no file of the
  repository is one a run writes, and the code that writes it spells it.
- **module paths** (``conductor.sandbox.inside``, ``conductor.redact.SECRETS``, a
  src/ docstring's ``:mod:`.data``` and ``:func:`strip_think```, ARCHITECTURE.md's
  ``userfiles.open_regular`` and "``llm/factory.py``'s ``CLIENTS``"): the module
  exists and defines the name, read from its source (nothing is imported).  A
  ``conductor.key`` that starts in no module is a key we write (a pool file's
  ``conductor.subtasks``, a span's ``conductor.cost_usd``): the code spells it.
- **commands**: ``conductor ...`` parsed against the command tree itself (typer's click
  commands: each subcommand, and each ``--option`` of the command it is given to), a
  repository file it names (``--pool pools/paper.yaml``) present; a script run with
  ``python`` and its flags against the flags the script spells; ``python -m`` and a
  module of ours against the module's file.

A failure names the doc and line, the name as written and what is missing, all of them
at once; the lead re-runs this after moving modules and fixes what it names.
"""

from __future__ import annotations

import ast
import builtins
import functools
import os
import re
import shlex
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "conductor"

#: File names a reader chooses in an example (their own files, not ours).
EXAMPLE_FILES = {
    "run.json",
    "ask.json",
    "junit.xml",
    "summary.md",
    "view.html",
    "keys.yaml",
    "my-pool.yaml",
    "my_math.jsonl",
    "their-prompt.yaml",
    "main.py",
    "a.txt",
}
DATA_SUFFIXES = ("json", "jsonl", "yaml", "yml", "txt", "npy", "md", "toml", "html")
#: A file or folder name in running text: `dir/name.ext`, `name.ext`, `dir/`.
PATH_WORD = re.compile(
    r"(?<![\w./:@<~$-])((?:[\w.*<>-]+/)*[\w*<>-]+\.(?:py|" + "|".join(DATA_SUFFIXES) + r")"
    r"|(?:[\w-]+/)+)(?![\w/-]|\.\w)"
)
#: `conductor.a.b`, not `conductor.py` nor `conductor.json` (files of that name).
DOTTED = re.compile(
    r"(?<![\w./-])conductor(?:\.\w+)+(?![\w-])(?<!\.py)"
    + "".join(rf"(?<!\.{s})" for s in DATA_SUFFIXES)
)
SPAN = re.compile(r"``(.+?)``|`([^`\n]+(?:\n[^`\n]+)?)`", re.DOTALL)
ROLE = re.compile(r":(func|class|meth|mod|data|attr|exc|obj):`~?([\w.]+)`")
#: `ARGS`, `OUTPUT_DIR`, `<cache>`: a part of a command or path the reader fills in.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]+\b|<[^>]*>")
#: The ones a path of the docs uses (`DESIGN.md` is a file's name, not one of them).
PATH_PLACEHOLDER = re.compile(r"\b(?:DIR|OUTPUT_DIR|NAME|FILE|CONFIG|ORG|PATH|ID)\b|<[^>]*>")


@dataclass(frozen=True)
class Passage:
    """A paragraph, table row or docstring: where it is and what it says."""

    doc: Path
    line: int
    text: str
    #: Folders a bare file name of this passage is looked for in.
    scope: tuple[Path, ...]
    #: The module whose docstring this is (its roles resolve there), else None.
    module: Path | None = None

    def at(self, offset: int) -> str:
        line = self.line + self.text.count("\n", 0, offset)
        return f"{self.doc.relative_to(ROOT)}:{line}"


# --- the passages ---


def markdown_docs() -> list[Path]:
    return [ROOT / "ARCHITECTURE.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _folders_named(text: str) -> list[Path]:
    """The folders of src/conductor or the repository a passage names (``llm/``,
    ``runs/rundir.py``): a bare file name beside them is looked for in them."""
    found: list[Path] = []
    for m in PATH_WORD.finditer(text):
        word = m.group(1)
        folder = word if word.endswith("/") else word.rpartition("/")[0] + "/"
        for base in (SRC, ROOT):
            if folder != "/" and (base / folder).is_dir() and base / folder not in found:
                found.append(base / folder)
    return found


def _passage(doc: Path, line: int, text: str, *near: Path, module: Path | None = None) -> Passage:
    return Passage(doc, line, text, (*near, *_folders_named(text), SRC, ROOT), module)


def markdown_passages(doc: Path) -> tuple[list[Passage], list[Passage]]:
    """A document's paragraphs (each table row one) and its code blocks' lines."""
    passages: list[Passage] = []
    code: list[Passage] = []
    para: list[str] = []
    start = 0
    fence = False

    def flush() -> None:
        if para:
            passages.append(_passage(doc, start + 1, "\n".join(para)))
            para.clear()

    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines()):
        if line.lstrip().startswith("```"):
            flush()
            fence = not fence
        elif fence:
            code.append(Passage(doc, n + 1, line, (ROOT,)))
        elif not line.strip() or line.startswith("|"):
            flush()
            if line.startswith("|"):
                passages.append(_passage(doc, n + 1, line))
        else:
            start = start if para else n
            para.append(line)
    flush()
    return passages, code


def python_files() -> list[Path]:
    return sorted(
        p
        for folder in ("src", "benchmarks", "tests")
        for p in (ROOT / folder).rglob("*.py")
        # src/conductor/benchmarks links to benchmarks/: read once, there.
        if not p.is_relative_to(SRC / "benchmarks")
    )


def literal_blocks(text: str) -> tuple[str, list[tuple[int, str]]]:
    """A docstring with its literal blocks (the indented lines after a ``::``, or an
    indented command line) blanked, and those lines: a block is an example (a config,
    a command), read as commands only, as a Markdown code block is."""
    prose: list[str] = []
    block: list[tuple[int, str]] = []
    lines = text.splitlines()
    base = min((len(x) - len(x.lstrip()) for x in lines[1:] if x.strip()), default=0)
    indent: int | None = None
    for k, line in enumerate(lines):
        depth = len(line) - len(line.lstrip())
        command = depth > base and re.match(r"\$ |python3? (?:-m |\S+\.py)", line.lstrip())
        if (indent is not None and (not line.strip() or depth > indent)) or command:
            block.append((k, line))
            prose.append("")
            continue
        indent = depth if line.rstrip().endswith("::") else None
        prose.append(line)
    return "\n".join(prose), block


def docstring_passages(path: Path) -> tuple[list[Passage], list[Passage]]:
    """A module's docstrings (a test module's own only) and their literal blocks' lines."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if path.is_relative_to(ROOT / "tests"):
        nodes: tuple[ast.AST, ...] = (_module_docstring(path),)
    else:
        nodes = facts(path).documented
    found: list[Passage] = []
    code: list[Passage] = []
    for node in nodes:
        body = getattr(node, "body", [])
        first = body[0].value if body and isinstance(body[0], ast.Expr) else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            # Its whole lines: the offsets within them are the file's.
            prose, block = literal_blocks("".join(lines[first.lineno - 1 : first.end_lineno]))
            module = path if path.is_relative_to(SRC) else None
            near = (path.parent, ROOT / "tests") if "tests" in path.parts else (path.parent,)
            passage = _passage(path, first.lineno, prose, *near, module=module)
            found.append(passage)
            code += [Passage(path, first.lineno + k, line, passage.scope) for k, line in block]
    return found, code


def _module_docstring(path: Path) -> ast.Module:
    """A module with its docstring alone, read without parsing the rest (a test
    module's code is not read here, only its docstring)."""
    with path.open(encoding="utf-8") as source:
        for token in tokenize.generate_tokens(source.readline):
            if token.type in {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENCODING}:
                continue
            if token.type == tokenize.STRING:
                text = "\n" * (token.start[0] - 1) + token.string
                return ast.parse(text)
            break
    return ast.Module(body=[], type_ignores=[])


def comment_passages(path: Path) -> list[Passage]:
    """A module's comments, each run of comment lines one passage."""
    runs: list[tuple[int, list[str]]] = []
    with path.open(encoding="utf-8") as source:
        for token in tokenize.generate_tokens(source.readline):
            if token.type != tokenize.COMMENT:
                continue
            line = token.start[0]
            if runs and runs[-1][0] + len(runs[-1][1]) == line:
                runs[-1][1].append(token.string)
            else:
                runs.append((line, [token.string]))
    return [_passage(path, line, "\n".join(text), path.parent) for line, text in runs]


@functools.cache
def all_passages() -> tuple[tuple[Passage, ...], tuple[Passage, ...]]:
    """Every passage of the docs, and every line of their code blocks."""
    passages: list[Passage] = []
    code: list[Passage] = []
    for doc in markdown_docs():
        prose, lines = markdown_passages(doc)
        passages += prose
        code += lines
    for path in python_files():
        prose, lines = docstring_passages(path)
        passages += prose
        code += lines
        if not path.is_relative_to(ROOT / "tests"):
            passages += comment_passages(path)
    return tuple(passages), tuple(code)


def spans(passage: Passage) -> Iterator[tuple[int, str]]:
    """The quoted names of a passage (Markdown's `x`, reST's ``x``), spaces folded."""
    for m in SPAN.finditer(passage.text):
        text = m.group(1) if m.group(1) is not None else m.group(2)
        yield m.start(), " ".join(text.split())


# --- files ---


@functools.cache
def repository_files() -> frozenset[str]:
    """The names of the files of the repository (sources, data, docs)."""
    skip = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    found: set[str] = set()
    for _folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        found.update(files)
    return frozenset(found)


@functools.cache
def spelled_in_code() -> frozenset[str]:
    """Every string literal of src/ and benchmarks/ but their docstrings: a file a run
    writes, a key a record holds, is spelled by the code that writes it."""
    found: set[str] = set()
    for path in python_files():
        if not path.is_relative_to(ROOT / "tests"):
            found |= facts(path).strings
    return frozenset(found)


@functools.cache
def _spelled_text() -> str:
    return "\0".join(spelled_in_code())


def spelled(name: str) -> bool:
    return name in _spelled_text()


def _is_ours(path: str, scope: tuple[Path, ...]) -> bool:
    """Whether a path starts in a folder of the repository, of src/conductor or of the
    passage (``vllm/entrypoints/...`` and ``litellm/`` are another project's)."""
    first = path.split("/")[0]
    return any((base / first).is_dir() for base in (*scope, SRC, ROOT / "src", ROOT))


def path_problem(word: str, scope: tuple[Path, ...]) -> str | None:
    """Why a file or folder name does not resolve, or None when it does."""
    if word in EXAMPLE_FILES or word.startswith(("/", "~", "./", "../")):
        return None  # the reader's own file, an absolute path
    pattern = PATH_PLACEHOLDER.sub("*", word)
    folder, _, name = pattern.rstrip("/").rpartition("/")
    if folder and not _is_ours(pattern, scope):
        # DIR/samples.jsonl, OUTPUT_DIR/metrics.jsonl: a file in a folder the user
        # names (its name is ours); vllm/..., litellm/: another project's.
        if folder.startswith("*") and "*" not in name and not spelled(name):
            return "no module spells this file name"
        return None
    for base in (*scope, SRC, ROOT / "src", ROOT) if folder else scope:
        if any(base.glob(pattern.rstrip("/"))) if "*" in pattern else (base / pattern).exists():
            return None
    if not folder and pattern.endswith("/"):
        return None  # a folder a run writes (`out/`, `runs/`)
    if not folder and pattern.rpartition(".")[2] in DATA_SUFFIXES:
        if pattern in repository_files() or "*" in pattern or spelled(pattern):
            return None  # one of ours elsewhere, or a file a run writes
        return "no such file in the repository, and no module spells this name"
    looked = ", ".join(
        str(b.relative_to(ROOT)) or "."
        for b in dict.fromkeys((*scope, SRC, ROOT) if folder else scope)
    )
    return f"no such file (looked in {looked})"


# --- modules and the names they define, read from their source ---


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Facts:
    """What one walk over a module finds: the nodes with docstrings, the strings its
    code spells (docstrings left out) and every name it binds anywhere."""

    documented: tuple[ast.AST, ...]
    strings: frozenset[str]
    names: frozenset[str]


@functools.cache
def facts(path: Path) -> Facts:
    tree = _tree(path)
    documented: list[ast.AST] = []
    docstrings: set[int] = set()
    strings: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                documented.append(node)
                docstrings.add(id(first.value))
            if not isinstance(node, ast.Module):
                names.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                strings.add(node.value)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return Facts(tuple(documented), frozenset(strings), frozenset(names))


def module_file(dotted: str) -> Path | None:
    """``conductor.a.b`` (or ``a.b`` under src/conductor) as a file, if it is a module."""
    parts = dotted.split(".")
    if parts[0] == "conductor":
        parts = parts[1:]
    if not parts or not all(part.isidentifier() for part in parts):
        return None
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dotted_name(module: Path) -> str:
    name = module.relative_to(SRC).with_suffix("").as_posix().replace("/", ".")
    return "conductor." + name.removesuffix(".__init__").removesuffix("__init__")


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds (inside `if`, `try` and `with` too)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For):
            for block in ("body", "orelse", "finalbody"):
                names.update(_defined(getattr(node, block, [])))
            for handler in getattr(node, "handlers", []):
                names.update(_defined(handler.body))
    return names


def attribute_problem(module: Path, attrs: list[str]) -> str | None:
    """Why ``module.attrs[0].attrs[1]...`` is not defined there, or None."""
    scope = _defined(_tree(module).body)
    owner = _dotted_name(module)
    for k, attr in enumerate(attrs):
        if attr not in scope:
            package = module.name == "__init__.py" and k == 0
            sub = module_file(f"{owner}.{attr}") if package else None
            if sub is not None:  # a package's module is an attribute of it
                return attribute_problem(sub, attrs[1:]) if attrs[1:] else None
            return f"{owner} defines no {attr!r}"
        node = scope[attr]
        if not isinstance(node, ast.ClassDef):
            return None  # a value or an import: not followed further
        scope = _defined(node.body)
        if k + 1 < len(attrs) and attrs[k + 1] not in scope and node.bases:
            return None  # perhaps inherited
        owner = f"{owner}.{attr}"
    return None


def dotted_problem(dotted: str) -> str | None:
    """``conductor.x.y.Name``: the longest module prefix exists and defines the rest; a
    ``conductor.key`` that starts in no module is a key we write (a pool file's
    ``conductor.subtasks``, a span's ``conductor.cost_usd``): some module spells it."""
    parts = dotted.split(".")
    if any(p.startswith("__") for p in parts):
        return None  # `conductor.__file__`
    for cut in range(len(parts), 1, -1):
        module = module_file(".".join(parts[:cut]))
        if module is not None:
            return attribute_problem(module, parts[cut:]) if parts[cut:] else None
    if all(spelled(p) for p in parts[1:]):
        return None
    return "no such module (and no module spells it as a key)"


@functools.cache
def names_anywhere() -> frozenset[str]:
    """Every name src/ binds somewhere: functions, classes, attributes, variables."""
    found: set[str] = set()
    for path in python_files():
        if path.is_relative_to(SRC):
            found |= facts(path).names
    return frozenset(found)


def role_problem(role: str, target: str, module: Path) -> str | None:
    """A Sphinx role's target, looked up from the module whose docstring it is in:
    a module (``.data`` relative to its package), a name of the module or of the
    module it names, or (a method, an attribute) a name defined somewhere in src/."""
    package = _dotted_name(module)
    if module.name != "__init__.py":
        package = package.rpartition(".")[0]
    if target.startswith("."):
        target = package + target
    if target.startswith("conductor."):
        return dotted_problem(target)
    head, *rest = target.split(".")
    if head in _defined(_tree(module).body):
        return attribute_problem(module, [head, *rest])
    if module_file(head) is not None:
        return dotted_problem(f"conductor.{target}")
    if rest or role == "mod" or hasattr(builtins, head):
        return None  # another library's (`rich.table.Table`, `:mod:`ast``), a builtin
    return None if head in names_anywhere() else f"nothing in src/ defines {head!r}"


# --- the command tree ---


@functools.cache
def cli() -> Any:
    """The click command of ``conductor``, as typer builds it."""
    import typer

    from conductor.cli.app import app

    return typer.main.get_command(app)


def _options(command: Any) -> set[str]:
    found = {"--help"}
    for param in command.params:
        if param.param_type_name == "option":
            found.update(param.opts, param.secondary_opts)
    return found


def conductor_problem(words: list[str]) -> str | None:
    """Why ``conductor WORDS...`` does not parse against the command tree, or None."""
    command, path = cli(), "conductor"
    for k, word in enumerate(words):
        if word.startswith("-") and len(word) > 1 and not re.match(r"-\d", word):
            option = word.split("=")[0]
            if option not in _options(command):
                return f"`{path}` has no option {option}"
            continue
        subcommands: dict[str, Any] = getattr(command, "commands", {})
        if not subcommands:
            continue  # an argument, or an option's value
        if PLACEHOLDER.fullmatch(word):
            return None  # `conductor ARGS`: the command left open
        if "|" in word:  # `cache stats|clear`: each of them
            for each in word.split("|"):
                problem = conductor_problem([*words[:k], each, *words[k + 1 :]])
                if problem:
                    return problem
            return None
        if word not in subcommands:
            return f"`{path}` has no command {word!r}"
        command, path = subcommands[word], f"{path} {word}"
    return None


def _spelled_in(script: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(_tree(script))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def python_problem(words: list[str], scope: tuple[Path, ...]) -> str | None:
    """Why ``python SCRIPT [FLAGS]`` or ``python -m conductor.X`` names what is not
    there: a script's flags are those it spells (``add_argument``, ``sys.argv``)."""
    while words and words[0] in {"-I", "-u", "-E", "-s", "-S", "-B"}:
        words = words[1:]
    if len(words) >= 2 and words[0] == "-m":
        ours = words[1].startswith("conductor.")
        return f"no module {words[1]}" if ours and not module_file(words[1]) else None
    if not words or not words[0].endswith(".py"):
        return None
    script = next((b / words[0] for b in (*scope, ROOT) if (b / words[0]).is_file()), None)
    if script is None:
        return f"no script {words[0]}"
    flags = {"--help", "-h"} | _spelled_in(script)
    for word in words[1:]:
        flag = word.split("=")[0]
        if flag.startswith("--") and flag not in flags:
            return f"{words[0]} has no option {flag}"
    return None


def command_words(text: str) -> list[list[str]]:
    """The commands of a shell line: split at `&&` and `;`, comments and `[...]`
    brackets left out, `VAR=value` prefixes dropped."""
    text = re.sub(r"(^|\s)#.*$", "", text)
    commands: list[list[str]] = []
    for part in re.split(r"&&|;|\s\|\s|(?:^|\s)\$ ", text):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        words = [w.strip("[]") for w in words if w.strip("[]") not in {"", "..."}]
        while words and re.match(r"\w+=", words[0]):
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def is_command(text: str) -> bool:
    return any(words[0] in {"conductor", "python", "python3"} for words in command_words(text))


def command_problems(text: str, scope: tuple[Path, ...]) -> list[str]:
    found: list[str] = []
    for words in command_words(text):
        if words[0] == "conductor" and not (len(words) > 1 and words[1][:1].isupper()):
            problem = conductor_problem(words[1:])
        elif words[0] in {"python", "python3"}:
            problem = python_problem(words[1:], scope)
        else:
            continue
        if problem:
            found.append(problem)
        # The repository's files it names (a pool, a config, test data) are there.
        for word in words[1:]:
            value = word.split("=")[-1].split(":")[-1]
            if re.match(r"(pools|configs|benchmarks|tests|docs|src)/", value):
                problem = path_problem(value, (ROOT,))
                found += [f"{value}: {problem}"] if problem else []
    return found


# --- the checks ---


def passage_problems(passage: Passage, *, attributes: bool) -> list[str]:
    """What a passage names that is not there, one line each (``DOC:LINE: ...``).
    ``attributes``: read ``module.name`` spans as a module and a name in it (as
    ARCHITECTURE.md writes them; elsewhere `text.format` is an API's field)."""
    found: list[str] = []

    def bad(offset: int, name: str, why: str) -> None:
        found.append(f"{passage.at(offset)}: names `{name}`: {why}")

    quoted = list(spans(passage))
    commands = [(o, t) for o, t in quoted if is_command(t)]
    for offset, text in commands:
        for problem in command_problems(text, passage.scope):
            bad(offset, text, problem)
    for offset, text in quoted:
        after = passage.text[offset:]
        owner = re.match(r"`+([\w/]+\.py)`+'s `+(\w+)`+", after)
        module = module_file(owner.group(1)[:-3].replace("/", ".")) if owner else None
        if owner and module is not None:  # `llm/factory.py`'s `CLIENTS`
            problem = attribute_problem(module, [owner.group(2)])
            if problem:
                bad(offset, owner.group(0).replace("``", "`"), problem)
        attr = re.fullmatch(r"((?:\w+/)*\w+)\.(\w+(?:\.\w+)*)(?:\(\))?", text)
        if attr and (attributes or "/" in attr.group(1)) and not text.startswith("conductor."):
            module = module_file(attr.group(1).replace("/", "."))
            if module is not None and attr.group(2) not in DATA_SUFFIXES + ("py",):
                problem = attribute_problem(module, attr.group(2).split("."))
                if problem:
                    bad(offset, text, problem)
    for m in PATH_WORD.finditer(passage.text):
        if any(o <= m.start() < o + len(t) + 4 for o, t in commands):
            continue  # checked as part of its command
        problem = path_problem(m.group(1), passage.scope)
        if problem:
            bad(m.start(), m.group(1), problem)
    for m in DOTTED.finditer(passage.text):
        problem = dotted_problem(m.group(0))
        if problem:
            bad(m.start(), m.group(0), problem)
    if passage.module is not None:
        for m in ROLE.finditer(passage.text):
            problem = role_problem(m.group(1), m.group(2), passage.module)
            if problem:
                bad(m.start(), m.group(0), problem)
    return found


def code_line_problems(line: Passage) -> list[str]:
    shown = re.sub(r"\s+#.*$", "", line.text.strip())
    return [f"{line.at(0)}: names `{shown}`: {p}" for p in command_problems(line.text, line.scope)]


def test_every_name_the_docs_give_exists() -> None:
    passages, code = all_passages()
    found = [
        problem
        for passage in passages
        for problem in passage_problems(passage, attributes=passage.doc.name == "ARCHITECTURE.md")
    ]
    found += [problem for line in code for problem in code_line_problems(line)]
    assert not found, f"{len(found)} names in the docs are not in the code:\n" + "\n".join(found)


#: Over this many lines a module is named in ARCHITECTURE.md's "Long modules", with why.
LONG = 800


def test_architecture_names_every_long_module_and_only_those() -> None:
    """The list of long modules is the source's, both ways: a module that grew past the
    bound is named there, and one named there has not shrunk below it or gone."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text[text.index("## Long modules") :]
    section = section[: section.find("\n## ", 3)] if "\n## " in section[3:] else section
    named = set(re.findall(r"^- `([\w/]+\.py)`:", section, re.MULTILINE))
    sizes = {
        p.relative_to(SRC).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in SRC.rglob("*.py")
        if not p.is_relative_to(SRC / "benchmarks")
    }
    long = {name for name, lines in sizes.items() if lines > LONG}
    problems = [
        f"src/conductor/{name} has {sizes[name]} lines: ARCHITECTURE.md's Long modules "
        f"does not name it (add `- `{name}`: why` there, or split it)"
        for name in sorted(long - named)
    ] + [
        f"ARCHITECTURE.md's Long modules names {name}, which "
        + (f"has {sizes[name]} lines, not over {LONG}" if name in sizes else "does not exist")
        + ": take it off the list"
        for name in sorted(named - long)
    ]
    assert not problems, "\n".join(problems)
    assert named  # the list was found


#: What reading a file looks like in a renderer's code: the run directory's readers, or
#: a file opened itself.
READERS = {"SampleLines", "iter_records", "iter_heads", "find_sample", "read_record"}
OPENERS = {"open", "read_text", "read_bytes", "open_samples", "open_regular"}


def _reads_files(module: Path) -> bool:
    for node in ast.walk(_tree(module)):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(node, ast.Name | ast.Attribute) and name in READERS:
            return True
        if isinstance(node, ast.Call) and (
            getattr(node.func, "id", None) in OPENERS or getattr(node.func, "attr", None) in OPENERS
        ):
            return True
    return False


def test_the_renderers_that_read_files_are_the_ones_architecture_names() -> None:
    """ "The renderers read what they are handed", but for those the flow names: a
    renderer that starts reading a run's files is named there, or the claim is false."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    flow = text[text.index("## The flow") : text.index("## The floors")]
    sentence = re.search(r"[^.]*reads? a run directory itself[^.]*\.[^.]*\.", flow)
    assert sentence, "ARCHITECTURE.md's flow no longer says which renderers read files"
    named = set(re.findall(r"`(render/\w+\.py)`", sentence.group(0)))
    reading = {f"render/{p.name}" for p in (SRC / "render").glob("*.py") if _reads_files(p)}
    assert reading == named, (
        f"render/ modules that read files: {sorted(reading)}; ARCHITECTURE.md's flow "
        f"says {sorted(named)}"
    )


def test_the_docs_are_read() -> None:
    """What the test above reads is what it should: every doc, every docstring, the
    README's command blocks (a reader that found nothing would pass anything)."""
    passages, code = all_passages()
    docs = {p.doc.relative_to(ROOT).as_posix() for p in passages}
    assert {"ARCHITECTURE.md", "README.md", "docs/training.md"} <= docs
    assert "src/conductor/sandbox/inside/driver.py" in docs and "benchmarks/perf/grading.py" in docs
    assert "tests/test_code_grader.py" in docs
    lines = [c.text for c in code]
    assert any(t.startswith("conductor bench --resume runs/gpqa --retry-errors") for t in lines)
    assert any("python benchmarks/train/routing_proof.py" in t for t in lines)


#: Each kind of name, spelled wrong, and what the test must say of it.
WRONG = [
    ("`llm/nowhere.py`", "no such file"),
    ("a bare `nowhere.py` beside `llm/`", "no such file (looked in src/conductor/llm"),
    ("see DESIGN.md", "no such file"),
    ("`tests/cases/nowhere.json`", "no such file"),
    ("`nowhere.jsonl`", "no module spells this name"),
    ("`DIR/nowhere.jsonl`", "no module spells this file name"),
    ("`conductor.llm.nowhere`", "conductor.llm defines no 'nowhere'"),
    ("`conductor.nowhere_at_all`", "no such module"),
    ("`conductor.redact.NOWHERE`", "defines no 'NOWHERE'"),
    ("`conductor.configfile.ConfigReader.nowhere`", "ConfigReader defines no 'nowhere'"),
    ("`userfiles.nowhere`", "defines no 'nowhere'"),
    ("`runs/rundir.nowhere`", "defines no 'nowhere'"),
    ("`llm/factory.py`'s `NOWHERE`", "defines no 'NOWHERE'"),
    ("`conductor bench --no-such-option`", "`conductor bench` has no option --no-such-option"),
    ("`conductor nowhere`", "has no command 'nowhere'"),
    ("`conductor pools nowhere`", "`conductor pools` has no command 'nowhere'"),
    ("`conductor cache stats|nowhere`", "has no command 'nowhere'"),
    ("`conductor ask --pool pools/nowhere.yaml`", "no such file"),
    ("`python benchmarks/perf/grading.py --nowhere`", "has no option --nowhere"),
    ("`python benchmarks/perf/nowhere.py`", "no script"),
    ("`python -m conductor.nowhere`", "no module conductor.nowhere"),
]
RIGHT = [
    "`llm/caller.py`, `conductor.sandbox.inside`, `benchmarks/perf/grading.py`",
    "`tests/cases/grade_code.json`, `userfiles.open_regular`, `runs/rundir.record_line`",
    "`llm/factory.py`'s `CLIENTS`, `conductor.configfile.ConfigReader.integer`",
    "`conductor cache stats|clear`, `conductor bench smoke --strategy singles --limit 3`",
    "`conductor --debug ask - --pool pools/paper.yaml`, `python -m conductor.localmodel.host`",
    "`python benchmarks/train/routing_proof.py --smoke`, `DIR/samples.jsonl`, `summary.json`",
    "a pool's `conductor.subtasks`, a span's `conductor.cost_usd`, `vllm/sampling_params.py`",
]


@pytest.mark.parametrize(("text", "why"), WRONG)
def test_a_name_that_is_not_there_is_named(text: str, why: str) -> None:
    """The positive control: each kind of name, spelled wrong, is found and said, with
    the doc's name and line; spelled right (below), nothing is said."""
    passage = _passage(ROOT / "ARCHITECTURE.md", 7, f"A claim:\n{text}.")
    found = passage_problems(passage, attributes=True)
    assert any(why in f and f.startswith("ARCHITECTURE.md:8: names ") for f in found), found


@pytest.mark.parametrize("text", RIGHT)
def test_a_name_that_is_there_passes(text: str) -> None:
    passage = _passage(ROOT / "ARCHITECTURE.md", 7, text)
    assert passage_problems(passage, attributes=True) == []


def test_roles_resolve_from_their_module() -> None:
    text = SRC / "text.py"
    assert role_problem("func", "strip_think", text) is None
    assert role_problem("mod", "conductor.redact", text) is None
    assert role_problem("class", "asyncio.Task", text) is None
    assert "defines no" in (role_problem("mod", ".nowhere", SRC / "router" / "fit.py") or "")
    assert "nothing in src/ defines 'nowhere'" in (role_problem("func", "nowhere", text) or "")
