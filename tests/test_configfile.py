"""The configuration wing: one error base with a sibling per kind of file, the public
line-aware reader, one shipped-file discovery, and a model-call layer that does not
need the pool loader."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

import conductor
from conductor.bench.spec import load_benchmark_text, resolve_benchmark_path
from conductor.bounds import Bound
from conductor.conductors.prompt import load_conductor_template
from conductor.configfile import ConfigReader, compose_yaml, did_you_mean, node_line
from conductor.errors import (
    BenchmarkFileError,
    ConfigFileError,
    PoolError,
    TemplateFileError,
    TrainConfigError,
    UsageError,
)
from conductor.pool import load_pool_text, resolve_pool_path
from conductor.shipped import ShippedKind, resolve_shipped, shipped, shipped_dir, shipped_names
from conductor.targets import CLIENT_KINDS, POOL_CLIENT_KINDS
from conductor.train.config import load_train_config_text

SRC = Path(__file__).resolve().parent.parent / "src" / "conductor"
KINDS = (PoolError, BenchmarkFileError, TrainConfigError, TemplateFileError)

# ------------------------------------------------------------------ the error family


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_each_file_kind_has_its_own_error_under_one_base(kind: type[ConfigFileError]) -> None:
    assert issubclass(kind, ConfigFileError) and issubclass(kind, UsageError)
    # Siblings: a benchmark-file error is not a pool error, nor the other way round.
    assert [other for other in KINDS if other is not kind and issubclass(kind, other)] == []
    err = kind("no such thing", path="f.yaml", line=3, field="x")
    assert str(err) == "f.yaml:3: no such thing" and err.reason == "no such thing"
    assert conductor.ConfigFileError is ConfigFileError


def test_every_loader_raises_its_own_kind_catchable_as_the_base(tmp_path: Path) -> None:
    raised: list[ConfigFileError] = []
    chat = tmp_path / "bad.yaml"
    chat.write_text("user: [x]\n", encoding="utf-8")
    for load in (
        lambda: load_pool_text("workers: 3\n", source="p.yaml", environ={}),
        lambda: load_benchmark_text("prompt: x\n", source="b.yaml"),
        lambda: load_train_config_text("pool: local\n", source="t.yaml", environ={}),
        lambda: load_conductor_template(str(chat)),
    ):
        with pytest.raises(ConfigFileError) as info:
            load()
        raised.append(info.value)
    assert [type(e) for e in raised] == list(KINDS)
    assert [str(e).split(":")[0] for e in raised] == ["p.yaml", "b.yaml", "t.yaml", str(chat)]
    assert not isinstance(raised[1], PoolError)


# ------------------------------------------------------------------ the public reader


class _ServeFile(ConfigReader):
    """A file kind the wing does not know about, read with nothing but its public API."""

    error_class = TrainConfigError

    def port(self, root: yaml.Node | None) -> int:
        get = self.document(root, ("port", "host"), empty="empty", required=("port",))
        port = self.integer(get["port"], "port", Bound(1, 65535))
        assert port is not None
        return port


def _read_port(text: str, environ: dict[str, str]) -> int:
    reader = _ServeFile("serve.yaml", environ)
    try:
        return reader.port(compose_yaml(text, "serve.yaml", TrainConfigError))
    finally:
        reader.close()


def test_a_new_file_kind_gets_lines_did_you_mean_and_variables_from_the_reader() -> None:
    assert _read_port("host: x\nport: ${PORT:-8080}\n", {}) == 8080
    assert _read_port("port: ${PORT}\n", {"PORT": "9000"}) == 9000
    with pytest.raises(TrainConfigError, match=r'^serve.yaml:2: top level: unknown key "prot" '):
        _read_port("host: x\nprot: 1\n", {})
    with pytest.raises(TrainConfigError, match=r'did you mean "port"\?'):
        _read_port("prot: 1\n", {})
    with pytest.raises(
        TrainConfigError, match=r"^serve.yaml:3: port must be an integer from 1 to 65,535"
    ):
        _read_port("host: x\n\nport: 0\n", {})
    root = compose_yaml("a: 1\nb:\n  c: 2\n", "x.yaml", ConfigFileError)
    assert isinstance(root, yaml.MappingNode) and node_line(root.value[1][1]) == 3
    assert did_you_mean("grpo", ("group", "gpu")) == ' (did you mean "group"?)'
    assert did_you_mean("zzz", ("group",)) == ""


# ------------------------------------------------------------------ shipped files


def test_one_discovery_lists_and_finds_every_kind() -> None:
    assert shipped_names("pool") == [p.stem for p in shipped("pool")]
    assert {"frontier", "paper"} <= set(shipped_names("pool"))
    assert "gpqa-diamond" in shipped_names("benchmark")
    # The revision text is part of every text template, not a template to choose.
    assert "revise" not in shipped_names("template") and "default" in shipped_names("template")
    assert resolve_shipped("template", "revise").name == "revise.txt"
    named: list[tuple[ShippedKind, str]] = [("pool", "paper"), ("benchmark", "mmlu")]
    for kind, name in [*named, ("template", "chat")]:
        found = resolve_shipped(kind, name)
        assert found.parent == shipped_dir(kind) and found.stem == name
    assert resolve_pool_path("paper.yaml") == resolve_shipped("pool", "paper")


def test_a_file_wins_over_a_shipped_name_except_for_templates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("paper", "mmlu", "default"):
        (tmp_path / name).write_text("workers: []\n", encoding="utf-8")
    assert resolve_shipped("pool", "paper") == Path("paper")
    assert resolve_shipped("benchmark", "mmlu") == Path("mmlu")
    # A checkpoint that names the default template gets the one it was trained with.
    assert resolve_shipped("template", "default") == shipped_dir("template") / "default.txt"


@pytest.mark.parametrize(
    ("kind", "error", "typo", "close"),
    [
        ("pool", PoolError, "frontir", "frontier"),
        ("benchmark", BenchmarkFileError, "gpqa-diamnd", "gpqa-diamond"),
        ("template", TemplateFileError, "compakt", "compact"),
    ],
)
def test_an_unknown_name_fails_alike_for_every_kind(
    tmp_path: Path, kind: ShippedKind, error: type[ConfigFileError], typo: str, close: str
) -> None:
    names = ", ".join(shipped_names(kind))
    with pytest.raises(error) as info:
        resolve_shipped(kind, typo)
    assert str(info.value) == (
        f'no {kind} file or shipped {kind} named "{typo}" (did you mean "{close}"?); '
        f"shipped {kind}s: {names}; give one of those names or a {kind} file's path"
    )
    # A missing path is a missing file; its file name is still matched.
    path = tmp_path / f"{typo}.yaml"
    with pytest.raises(error) as info:
        resolve_shipped(kind, str(path))
    assert str(info.value) == (
        f'no {kind} file "{path}": no such file (did you mean the shipped {kind} "{close}"?); '
        f"give an existing {kind} file, or a shipped {kind} by name: {names}"
    )


def test_benchmark_names_resolve_as_before() -> None:
    assert resolve_benchmark_path("mmlu.yaml").name == "mmlu.yaml"
    with pytest.raises(BenchmarkFileError, match="shipped benchmarks: aime24, "):
        resolve_benchmark_path("zzzz")


# ------------------------------------------------------------------ targets and llm/


def test_checkpoint_is_a_client_kind_a_pool_file_cannot_name() -> None:
    assert "checkpoint" in CLIENT_KINDS and "checkpoint" not in POOL_CLIENT_KINDS
    assert set(POOL_CLIENT_KINDS) < set(CLIENT_KINDS)
    with pytest.raises(PoolError, match=r"client must be one of litellm, .*local; got"):
        load_pool_text("workers:\n  - {id: a, model: m, client: checkpoint}\n", environ={})


def test_the_model_call_layer_imports_no_pool_loader() -> None:
    """``llm/`` takes Worker and Price from :mod:`conductor.targets`: importing a client
    must not need the pool file reader."""
    offenders = []
    for path in sorted((SRC / "llm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                target = "." * node.level + (node.module or "")
                if target in ("..pool", "conductor.pool") or target.endswith(
                    ("configfile", "bench.spec")
                ):
                    offenders.append(f"{path.name}:{node.lineno} {target}")
    assert offenders == []
    assert list((SRC / "llm").glob("*.py")), "the llm package moved: update this test"


def test_a_key_written_into_any_config_file_is_refused_naming_that_kind() -> None:
    with pytest.raises(PoolError, match="do not write an API key in a pool file"):
        load_pool_text("workers:\n  - {id: a, model: m, api_key: sk-x}\n", environ={})
    with pytest.raises(BenchmarkFileError, match=r"b.yaml:2: .*API key in a benchmark file"):
        load_benchmark_text("prompt: x\napi_key: sk-x\n", source="b.yaml")
