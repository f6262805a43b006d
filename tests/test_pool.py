"""Pool files: loading, validation messages with lines, env expansion, shipped pools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor.errors import PoolError, UsageError
from conductor.pool import (
    builtin_pools_dir,
    list_builtin_pools,
    load_pool,
    load_pool_text,
    pool_to_public_dict,
    resolve_pool_path,
)
from conductor.targets import ConductorConfig, Price, Worker

CASES = json.loads((Path(__file__).parent / "cases" / "bad_pools.json").read_text("utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_pool_names_line_and_field(case: dict[str, object]) -> None:
    with pytest.raises(PoolError) as info:
        load_pool_text(str(case["yaml"]), source="pools/bad.yaml", environ={})
    err = info.value
    text = str(err)
    assert err.line == case["line"], text
    assert err.path == "pools/bad.yaml"
    assert text.startswith(f"pools/bad.yaml:{case['line']}: "), text
    assert str(case["error"]) in text
    # One sentence on one line, with no traceback-like noise.
    assert "\n" not in text
    assert "Node(" not in text
    assert isinstance(err, UsageError)


def test_bad_cases_are_many_and_distinct() -> None:
    assert len(CASES) >= 25
    assert len({c["name"] for c in CASES}) == len(CASES)


def test_error_carries_field_path() -> None:
    text = "workers:\n  - id: a\n    model: m\n  - id: b\n    model: n\n    max_concurrency: many\n"
    with pytest.raises(PoolError) as info:
        load_pool_text(text, source="pools/x.yaml", environ={})
    assert info.value.field == "workers[1].max_concurrency"
    assert (
        info.value.reason
        == 'workers[1].max_concurrency must be an integer from 1 to 100,000, got "many"'
    )
    assert str(info.value) == (
        "pools/x.yaml:6: workers[1].max_concurrency must be an integer from 1 to 100,000, "
        'got "many"'
    )


def test_api_key_env_error_does_not_echo_the_key() -> None:
    key = "sk-proj-AbCdEf0123456789secret"
    text = f"workers:\n  - id: a\n    model: m\n    api_key_env: {key}\n"
    with pytest.raises(PoolError) as info:
        load_pool_text(text, environ={})
    assert key not in str(info.value)


# ------------------------------------------------------------------ env expansion

ENV_POOL = """\
name: ${POOL_NAME:-envpool}
workers:
  - id: a
    model: ${MODEL_A:-openai/gpt-5}
    api_base: ${A_BASE:-}
    max_tokens: ${A_TOKENS:-2048}
    description: "${A_DESC:-7}"
    params:
      extra_headers:
        X-Org: ${ORG:-acme}
      stop: ["${STOP:-END}"]
"""


def test_env_defaults_used_when_unset() -> None:
    pool = load_pool_text(ENV_POOL, environ={})
    w = pool.workers[0]
    assert pool.name == "envpool"
    assert w.model == "openai/gpt-5"
    assert w.api_base is None  # empty after expansion means unset
    assert w.params["max_tokens"] == 2048  # a plain scalar is typed after expansion
    assert w.description == "7"  # a quoted one stays a string
    assert w.params["extra_headers"] == {"X-Org": "acme"}
    assert w.params["stop"] == ["END"]


def test_env_values_override_defaults() -> None:
    env = {
        "POOL_NAME": "mine",
        "MODEL_A": "anthropic/claude-sonnet-4-20250514",
        "A_BASE": "http://10.0.0.5:8000/v1",
        "A_TOKENS": "512",
        "ORG": "lab",
        "STOP": "###",
    }
    pool = load_pool_text(ENV_POOL, environ=env)
    w = pool.workers[0]
    assert pool.name == "mine"
    assert w.model == "anthropic/claude-sonnet-4-20250514"
    assert w.api_base == "http://10.0.0.5:8000/v1"
    assert w.params["max_tokens"] == 512
    assert w.params["extra_headers"] == {"X-Org": "lab"}
    assert w.params["stop"] == ["###"]


def test_empty_variable_takes_default_and_plain_reference_may_be_empty() -> None:
    text = "workers:\n  - id: a\n    model: ${M:-x/y}\n    api_base: ${BASE}\n"
    pool = load_pool_text(text, environ={"M": "", "BASE": ""})
    assert pool.workers[0].model == "x/y"
    assert pool.workers[0].api_base is None


def test_env_defaults_to_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POOL_TEST_BASE", "https://gateway.example/v1")
    text = "workers:\n  - id: a\n    model: m\n    api_base: ${POOL_TEST_BASE}\n"
    assert load_pool_text(text).workers[0].api_base == "https://gateway.example/v1"
    monkeypatch.delenv("POOL_TEST_BASE")
    with pytest.raises(PoolError, match="POOL_TEST_BASE is not set"):
        load_pool_text(text)


def test_expanded_value_is_not_expanded_again() -> None:
    text = "workers:\n  - id: a\n    model: ${M}\n"
    assert load_pool_text(text, environ={"M": "${OTHER}"}).workers[0].model == "${OTHER}"


# ------------------------------------------------------------------ merging


MERGE_POOL = """\
defaults:
  temperature: 0.2
  max_tokens: 4096
  top_p: 0.9
  timeout_s: 120
  max_retries: 2
workers:
  - id: plain
    model: m1
  - id: own
    model: m2
    temperature: 0.7
    max_concurrency: 3
    timeout_s: 30
    params:
      max_tokens: 100
      reasoning_effort: minimal
"""


def test_defaults_merge_into_workers() -> None:
    pool = load_pool_text(MERGE_POOL, environ={})
    plain, own = pool.workers
    assert plain.params == {"temperature": 0.2, "max_tokens": 4096, "top_p": 0.9}
    assert (plain.timeout_s, plain.max_retries, plain.max_concurrency) == (120.0, 2, 16)
    # The worker's own keys beat the defaults, and its params beat both.
    assert own.params == {
        "temperature": 0.7,
        "max_tokens": 100,
        "top_p": 0.9,
        "reasoning_effort": "minimal",
    }
    assert (own.timeout_s, own.max_retries, own.max_concurrency) == (30.0, 2, 3)
    assert pool.defaults == {
        "temperature": 0.2,
        "max_tokens": 4096,
        "top_p": 0.9,
        "timeout_s": 120.0,
        "max_retries": 2,
    }


def test_dataclass_defaults_without_pool_defaults() -> None:
    pool = load_pool_text("workers:\n  - id: a\n    model: m\n", environ={})
    w = pool.workers[0]
    assert w == Worker(id="a", model="m")
    assert pool.conductor is None
    assert pool.name == "pool"


def test_yaml_merge_keys_and_anchors() -> None:
    text = """\
x-vllm: &vllm
  client: openai
  api_base: http://localhost:8000/v1
workers:
  - <<: *vllm
    id: a
    model: m
"""
    with pytest.raises(PoolError, match='top level: unknown key "x-vllm"'):
        load_pool_text(text, environ={})
    text = """\
workers:
  - &base
    id: a
    model: m
    client: openai
    api_base: http://localhost:8000/v1
  - <<: *base
    id: b
"""
    pool = load_pool_text(text, environ={})
    assert [(w.id, w.client, w.api_base) for w in pool.workers] == [
        ("a", "openai", "http://localhost:8000/v1"),
        ("b", "openai", "http://localhost:8000/v1"),
    ]


def test_local_worker_model_defaults_and_local_fields() -> None:
    text = (
        "workers:\n  - id: tiny\n    client: local\n    model_path: /models/x.gguf\n"
        "    n_ctx: 8192\n    n_threads: 2\n    n_gpu_layers: -1\n"
    )
    w = load_pool_text(text, environ={}).workers[0]
    assert (w.model, w.client, w.model_path) == ("smollm2", "local", "/models/x.gguf")
    assert (w.n_ctx, w.n_threads, w.n_gpu_layers) == (8192, 2, -1)


def test_worker_price_and_texts() -> None:
    text = (
        "workers:\n  - id: a\n    model: m\n"
        "    price: {input_per_mtok: 1.25, output_per_mtok: 10}\n"
        "    description: fast\n    system_prompt: Be brief.\n"
    )
    w = load_pool_text(text, environ={}).workers[0]
    assert w.price == Price(1.25, 10.0)
    assert (w.description, w.system_prompt) == ("fast", "Be brief.")


def test_conductor_section() -> None:
    text = """\
workers:
  - id: gpt-5
    model: openai/gpt-5
conductor:
  backend: prompted
  model: gpt-5
  template: prompts/mine.txt
  params: {temperature: 1.0}
  max_steps: 3
  parse_retries: 0
  show_descriptions: true
  constrained: yes
  timeout_s: 60
"""
    pool = load_pool_text(text, environ={})
    assert pool.conductor == ConductorConfig(
        backend="prompted",
        model="gpt-5",
        template="prompts/mine.txt",
        params={"temperature": 1.0},
        max_steps=3,
        parse_retries=0,
        show_descriptions=True,
        constrained=True,
        timeout_s=60.0,
    )
    assert pool.worker(pool.conductor.model).model == "openai/gpt-5"


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    file = tmp_path / "my-pool.yaml"
    file.write_text("workers:\n  - id: a\n    model: m\n", encoding="utf-8")
    pool = load_pool(file, environ={})
    assert pool.name == "my-pool"
    assert pool.path == file


def test_load_pool_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PoolError) as info:
        load_pool(missing, environ={})
    assert str(info.value) == f"{missing}: no such pool file"
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers:\n  - id: a\n    modle: m\n", encoding="utf-8")
    with pytest.raises(PoolError) as info:
        load_pool(bad, environ={})
    assert str(info.value) == f'{bad}:3: workers[0]: unknown key "modle" (did you mean "model"?)'


# ------------------------------------------------------------------ shipped pools


def test_shipped_pools_listed_and_found() -> None:
    names = {p.stem for p in list_builtin_pools()}
    assert {"frontier", "paper", "open"} <= names
    assert (
        resolve_pool_path("frontier").resolve() == (builtin_pools_dir() / "frontier.yaml").resolve()
    )
    assert resolve_pool_path("paper.yaml").name == "paper.yaml"


def test_package_symlink_points_at_repo_pools() -> None:
    repo_pools = Path(__file__).resolve().parent.parent / "pools"
    assert builtin_pools_dir().resolve() == repo_pools.resolve()


def test_resolve_pool_path_prefers_existing_file(tmp_path: Path) -> None:
    file = tmp_path / "frontier"
    file.write_text("workers: []\n", encoding="utf-8")
    assert resolve_pool_path(str(file)) == file


def test_resolve_unknown_pool_lists_shipped_names() -> None:
    with pytest.raises(PoolError) as info:
        resolve_pool_path("frontir")
    message = str(info.value)
    assert message.startswith('no pool file or shipped pool named "frontir"')
    for name in ("frontier", "open", "paper"):
        assert name in message


@pytest.mark.parametrize("path", list_builtin_pools(), ids=lambda p: p.stem)
def test_every_shipped_pool_loads_without_environment(path: Path) -> None:
    pool = load_pool(path, environ={})
    assert pool.name == path.stem
    assert pool.workers
    json.dumps(pool_to_public_dict(pool))


@pytest.mark.parametrize("name", ["frontier", "paper", "paper-unconstrained", "open"])
def test_my_shipped_pools_are_described(name: str) -> None:
    pool = load_pool(resolve_pool_path(name), environ={})
    assert pool.description
    assert pool.conductor is not None


def test_paper_pool_matches_the_paper() -> None:
    pool = load_pool(resolve_pool_path("paper"), environ={})
    assert [w.model for w in pool.workers] == [
        "gemini/gemini-2.5-pro",
        "anthropic/claude-sonnet-4-20250514",
        "openai/gpt-5",
        "Qwen/Qwen3-32B",
        "google/gemma-3-27b-it",
        "Qwen/Qwen3-32B",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    ]
    gemini, claude, gpt5, qwen, gemma, qwen_think, r1 = pool.workers
    for w in pool.workers:
        assert w.params["max_tokens"] == 4096
    for w in (gemini, claude, qwen, gemma, qwen_think, r1):
        assert w.params["temperature"] == 0.2
    assert gemini.params["thinking"]["budget_tokens"] == 128
    assert "thinking" not in claude.params
    assert gpt5.params["reasoning_effort"] == "minimal"
    for w, thinking in ((qwen, False), (qwen_think, True)):
        assert w.client == "openai"
        assert w.api_base == "http://localhost:8000/v1"
        assert w.params["top_p"] == 0.8
        assert w.params["presence_penalty"] == 1.0
        assert w.params["top_k"] == 20
        assert w.params["chat_template_kwargs"] == {"enable_thinking": thinking}
    assert pool.conductor is not None
    assert pool.conductor.backend == "endpoint"
    assert pool.conductor.api_base == "http://localhost:8001/v1"
    moved = load_pool(
        resolve_pool_path("paper"),
        environ={
            "QWEN3_32B_BASE_URL": "http://gpu1:9000/v1",
            "CONDUCTOR_BASE_URL": "http://c:1/v1",
        },
    )
    assert moved.workers[3].api_base == moved.workers[5].api_base == "http://gpu1:9000/v1"
    assert moved.conductor is not None and moved.conductor.api_base == "http://c:1/v1"


def test_paper_pool_sends_the_authors_worker_context() -> None:
    from conductor.llm.prefill import prefill_message

    shipped = load_pool(resolve_pool_path("paper"), environ={})
    # The authors' runner: a step-by-step opener each worker continues, and earlier
    # answers passed on with their reasoning.
    assert shipped.context.reasoning == "keep"
    assert shipped.context.prefill == "I'll work through this one step at a time."
    assert all(w.context == shipped.context for w in shipped.workers)
    continued = [w.id for w in shipped.workers if prefill_message(w, w.context.prefill)]
    # As the comment says: all but the Gemini and OpenAI workers continue the prefill.
    assert continued == [
        "claude-sonnet-4",
        "qwen3-32b",
        "gemma-3-27b-it",
        "qwen3-32b-thinking",
        "deepseek-r1-distill-qwen-32b",
    ]


def test_paper_unconstrained_pool_has_table_1_budgets() -> None:
    """Table 1's settings, as the authors' unconstrained evaluation scripts and clients
    set them (junho328/orchestrator@f1e64d9: conductor/eval/*/eval_conductor.sh,
    conductor/llm_clients.py), over paper.yaml's workers in paper.yaml's order."""
    paper = load_pool(resolve_pool_path("paper"), environ={})
    pool = load_pool(resolve_pool_path("paper-unconstrained"), environ={})
    assert [(w.id, w.model, w.api_base) for w in pool.workers] == [
        (w.id, w.model, w.api_base) for w in paper.workers
    ]
    gemini, claude, gpt5, qwen, gemma, qwen_think, r1 = pool.workers
    assert gemini.params["thinking"] == {"type": "enabled", "budget_tokens": 32768}
    assert gemini.params["max_tokens"] == 65535
    assert claude.params["thinking"] == {"type": "enabled", "budget_tokens": 32768}
    assert (claude.params["temperature"], claude.params["max_tokens"]) == (1, 64000)
    assert claude.context.prefill is None  # no prefill while Claude thinks
    assert gpt5.params["reasoning_effort"] == "high"
    assert (gpt5.params["temperature"], gpt5.params["max_tokens"]) == (1, 128000)
    for open_worker, constrained in zip(
        (qwen, gemma, qwen_think, r1), paper.workers[3:], strict=True
    ):
        assert open_worker.params["max_tokens"] == 64000
        assert open_worker.params["temperature"] == 0.2
        assert {k: v for k, v in open_worker.params.items() if k != "max_tokens"} == {
            k: v for k, v in constrained.params.items() if k != "max_tokens"
        }
    for w in (gemini, gpt5, qwen, gemma, qwen_think, r1):
        assert w.context == paper.workers[0].context
    # The Conductor is prompted and sampled as in paper.yaml.
    assert pool.conductor is not None and paper.conductor is not None
    assert pool.conductor == paper.conductor
    assert pool.conductor.template == "paper"


def test_frontier_and_open_pools() -> None:
    frontier = load_pool(resolve_pool_path("frontier"), environ={})
    assert [w.model for w in frontier.workers] == [
        "openai/gpt-5",
        "anthropic/claude-sonnet-4-20250514",
        "gemini/gemini-2.5-pro",
    ]
    assert frontier.defaults["temperature"] == 0.2
    assert frontier.conductor is not None and frontier.conductor.backend == "prompted"
    frontier.worker(frontier.conductor.model or "")
    opened = load_pool(resolve_pool_path("open"), environ={})
    assert 3 <= len(opened.workers) <= 4
    assert all(w.api_base == "http://localhost:11434/v1" for w in opened.workers)
    assert opened.conductor is not None and opened.conductor.backend == "prompted"
    opened.worker(opened.conductor.model or "")


# ------------------------------------------------------------------ public form

SECRET = "s3cr3t-VALUE-do-not-leak"


def test_public_dict_redacts_secrets() -> None:
    text = f"""\
workers:
  - id: a
    model: m
    client: openai
    api_base: https://user:{SECRET}@proxy.example/v1?api_key={SECRET}&region=eu
    api_key_env: PROXY_KEY
    params:
      max_tokens: 64
      extra_headers:
        Authorization: Bearer {SECRET}
        X-Api-Key: {SECRET}
  - id: b
    model: n
    api_base: http://h/v1?token={SECRET}&key={SECRET}
conductor:
  backend: endpoint
  api_base: http://me:{SECRET}@c.example/v1
"""
    pool = load_pool_text(text, environ={})
    public = pool_to_public_dict(pool)
    dumped = json.dumps(public)
    assert SECRET not in dumped
    a, b = public["workers"]
    assert a["api_key_env"] == "PROXY_KEY"
    assert a["api_base"] == "https://***@proxy.example/v1?api_key=***&region=eu"
    assert a["params"]["max_tokens"] == 64
    assert a["params"]["extra_headers"] == {"Authorization": "***", "X-Api-Key": "***"}
    assert b["api_base"] == "http://h/v1?token=***&key=***"
    assert public["conductor"]["api_base"] == "http://***@c.example/v1"
    # The pool itself keeps the real values for making calls.
    assert SECRET in (pool.workers[0].api_base or "")


def test_public_dict_shape(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text(
        "workers:\n  - id: a\n    model: m\n    price: {input_per_mtok: 1, output_per_mtok: 2}\n",
        encoding="utf-8",
    )
    public = pool_to_public_dict(load_pool(file, environ={}))
    assert public["path"] == str(file)
    assert public["name"] == "p"
    assert public["workers"][0]["price"] == {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    assert public["conductor"] is None
    assert json.loads(json.dumps(public)) == public


def test_aliased_mapping_with_merge_is_read_twice() -> None:
    text = """\
workers:
  - id: a
    model: m
    params: &p
      <<: {temperature: 0.5, seed: 1}
      seed: 2
  - id: b
    model: n
    params: *p
"""
    a, b = load_pool_text(text, environ={}).workers
    assert a.params == b.params == {"temperature": 0.5, "seed": 2}


def test_bad_url_error_hides_credentials() -> None:
    text = "workers:\n  - id: a\n    model: m\n    api_base: ${BASE}\n"
    with pytest.raises(PoolError) as info:
        load_pool_text(text, environ={"BASE": f"ftp://u:{SECRET}@h/v1?key={SECRET}"})
    assert SECRET not in str(info.value)
    assert "must be an http(s) URL" in str(info.value)


@pytest.mark.long
@pytest.mark.parametrize("depth", [500, 10_000])
def test_deeply_nested_yaml_is_one_error_not_a_recursion(depth: int) -> None:
    from conductor.bench.spec import load_benchmark_text

    text = "workers: " + "[" * depth + "]" * depth + "\n"
    with pytest.raises(PoolError, match="nested"):
        load_pool_text(text, source="deep.yaml", environ={})
    # The benchmark and training readers compose through the same function.
    with pytest.raises(UsageError, match="nested"):
        load_benchmark_text("prompt: " + "[" * depth + "]" * depth + "\n", source="deep.yaml")


def test_nesting_through_aliases_is_measured_where_it_is_used() -> None:
    # Each level is shallow, but the aliases stack it past the limit.
    lines = ["a0: &a0 [x]"]
    for i in range(1, 70):
        lines.append(f"a{i}: &a{i} [*a{i - 1}]")
    lines.append("workers: [*a69]")
    with pytest.raises(PoolError, match="nested more than 64 levels"):
        load_pool_text("\n".join(lines) + "\n", source="alias.yaml", environ={})


def test_conductor_total_timeout_reaches_its_call_target() -> None:
    """The Conductor's calls get a total deadline from its own section, like workers."""
    from conductor.conductors.spec import resolve_conductor

    text = (
        "name: p\nworkers:\n  - {id: w, model: m, client: openai, api_base: 'http://x/v1'}\n"
        "conductor:\n  backend: endpoint\n  api_base: http://localhost:8001/v1\n"
        "  timeout_s: 30\n  total_timeout_s: 45\n"
    )
    pool = load_pool_text(text, environ={})
    assert pool.conductor is not None and pool.conductor.total_timeout_s == 45.0
    target = resolve_conductor(pool).target
    assert (target.timeout_s, target.total_timeout_s) == (30.0, 45.0)
    with pytest.raises(PoolError, match="total_timeout_s"):
        load_pool_text(text.replace("45", "-1"), environ={})


async def test_library_run_refuses_an_oversized_question(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Orchestrator.run`` applies the question limit itself, before any call."""
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import Orchestrator

    monkeypatch.setenv("CONDUCTOR_MAX_QUESTION_CHARS", "10")
    text = (
        "name: p\nworkers:\n  - {id: w, model: m, client: openai, api_base: 'http://127.0.0.1:9/v1'}\n"
        "conductor:\n  backend: endpoint\n  api_base: http://127.0.0.1:9/v1\n"
    )
    pool = load_pool_text(text, environ={})
    async with Orchestrator(pool, resolve_conductor(pool)) as orch:
        with pytest.raises(UsageError, match="over the limit of 10"):
            await orch.run("x" * 11)


DEFAULTS_POOL = """\
defaults:
  temperature: 0.2
  max_tokens: 4096
  top_p: 0.9
  timeout_s: 120
  total_timeout_s: 300
  max_retries: 2
  max_concurrency: 256
workers:
  - id: a
    model: m
    temperature: 1
"""


def test_defaults_reach_the_conductor_section_under_its_own_keys() -> None:
    from conductor.conductors.spec import resolve_conductor

    text = DEFAULTS_POOL + (
        "conductor:\n  backend: endpoint\n  api_base: http://h/v1\n  max_tokens: 1024\n"
        "  max_retries: 0\n  params: {top_p: 0.5}\n"
    )
    pool = load_pool_text(text, environ={})
    cfg = pool.conductor
    assert cfg is not None
    # Every key of defaults: it does not set itself, and its own where it does.
    assert (cfg.temperature, cfg.max_tokens, cfg.top_p) == (0.2, 1024, 0.9)
    assert (cfg.timeout_s, cfg.total_timeout_s) == (120.0, 300.0)
    assert (cfg.max_retries, cfg.max_concurrency) == (0, 256)
    target = resolve_conductor(pool).target
    assert target.max_concurrency == 256 and target.timeout_s == 120.0
    # Its params beat both, as a worker's do.
    assert target.params == {"temperature": 0.2, "max_tokens": 1024, "top_p": 0.5}


def test_without_defaults_the_conductor_keeps_its_own_defaults() -> None:
    pool = load_pool_text(
        "workers:\n  - {id: a, model: m}\nconductor: {backend: endpoint, api_base: http://h/v1}\n",
        environ={},
    )
    assert pool.conductor == ConductorConfig(backend="endpoint", api_base="http://h/v1")


def test_a_prompted_conductor_naming_a_worker_is_that_worker() -> None:
    from conductor.conductors.spec import resolve_conductor

    pool = load_pool_text(DEFAULTS_POOL + "conductor: {backend: prompted, model: a}\n", environ={})
    # The worker has the defaults already, under its own temperature: nothing is added
    # to the section that could override it.
    assert pool.conductor == ConductorConfig(backend="prompted", model="a")
    target = resolve_conductor(pool).target
    assert target.params["temperature"] == 1
    assert (target.max_concurrency, target.timeout_s) == (256, 120.0)
    # A model that is no worker of the pool is a model like any other.
    other = load_pool_text(
        DEFAULTS_POOL + "conductor: {backend: prompted, model: openai/gpt-4o}\n", environ={}
    )
    assert other.conductor is not None
    assert (other.conductor.temperature, other.conductor.max_concurrency) == (0.2, 256)


def test_a_checkpoint_conductor_takes_no_sampling_defaults(tmp_path: Path) -> None:
    text = DEFAULTS_POOL + f"conductor: {{backend: checkpoint, model: {tmp_path}}}\n"
    cfg = load_pool_text(text, environ={}).conductor
    assert cfg is not None
    # Its sampling is what its conductor.json says it was trained with.
    assert (cfg.temperature, cfg.max_tokens, cfg.top_p) == (None, None, None)
    assert (cfg.timeout_s, cfg.max_retries) == (120.0, 2)


def test_a_conductor_from_the_command_line_takes_the_sections_defaults_or_none() -> None:
    from conductor.conductors.spec import resolve_conductor

    text = DEFAULTS_POOL + "conductor: {backend: endpoint, api_base: http://h/v1}\n"
    pool = load_pool_text(text, environ={})
    same = resolve_conductor(pool, "http://other/v1#c").target
    assert (same.api_base, same.max_concurrency, same.timeout_s) == ("http://other/v1", 256, 120.0)
    # Another backend is not the pool's Conductor: it has its own settings.
    other = resolve_conductor(pool, "prompted:openai/gpt-4o").target
    assert (other.max_concurrency, other.timeout_s) == (64, 600.0)


@pytest.mark.parametrize(
    ("yaml_text", "line", "error"),
    [
        (
            "defaults:\n  max_concurrency: 0\nworkers:\n  - {id: a, model: m}\n"
            "conductor: {backend: endpoint, api_base: http://h/v1}\n",
            2,
            "defaults.max_concurrency must be",
        ),
        (
            "defaults:\n  max_concurrency: 8\nworkers:\n  - {id: a, model: m}\n"
            "conductor:\n  backend: endpoint\n  api_base: http://h/v1\n  max_concurrency: 0\n",
            8,
            "conductor.max_concurrency must be",
        ),
    ],
)
def test_a_bad_concurrency_is_told_at_its_own_line(yaml_text: str, line: int, error: str) -> None:
    with pytest.raises(PoolError) as info:
        load_pool_text(yaml_text, source="pools/p.yaml", environ={})
    assert str(info.value).startswith(f"pools/p.yaml:{line}: {error}"), str(info.value)


def test_a_worker_states_its_request_rate(tmp_path: Path) -> None:
    good = tmp_path / "rate.yaml"
    good.write_text("workers:\n  - id: a\n    model: m\n    rpm: 500\n", encoding="utf-8")
    assert load_pool(good, environ={}).workers[0].rpm == 500.0
    for text, said in [
        ("    rpm: 0\n", "workers[0].rpm must be a positive number up to 1e+06, got 0"),
        ("    rmp: 5\n", 'workers[0]: unknown key "rmp" (did you mean "rpm"?)'),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text("workers:\n  - id: a\n    model: m\n" + text, encoding="utf-8")
        with pytest.raises(PoolError) as info:
            load_pool(bad, environ={})
        assert str(info.value) == f"{bad}:4: {said}"
