"""``conductor serve``: serve a pool's orchestrations as an OpenAI-compatible API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..bounds import BODY_BYTES, CALLS, CONCURRENCY, QUEUE, VOTES
from ..errors import UsageError
from ..text import plural
from ._common import load_pool, stderr
from ._options import ConductorOption, CostWeightOption, NoCacheOption, PoolOption, StateOption
from ._tracing import NoOtelOption, OtelContentOption, OtelOption, otel_from_options

if TYPE_CHECKING:
    from ..conductors.spec import Conductor
    from ..pool import Pool

__all__ = ["serve"]


def serve(
    pool: PoolOption = None,
    conductor: ConductorOption = None,
    cost_weight: CostWeightOption = None,
    router: Annotated[
        Path | None,
        typer.Option(
            "--router",
            help="Serve this router directory (conductor fit-router --out DIR) as the "
            "model `router`.",
            file_okay=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to listen on; 0 picks a free one.")
    ] = 8000,
    records: Annotated[
        Path | None,
        typer.Option(
            "--records",
            help="Append every run's record to DIR/samples.jsonl "
            "(conductor trace DIR --sample RUN_ID shows one).",
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env",
            help="Require requests to send the token held in this environment variable "
            "(Authorization: Bearer TOKEN).",
        ),
    ] = None,
    keys: Annotated[
        Path | None,
        typer.Option(
            "--keys",
            help="A keys file (YAML): each key's name, token_env (the variable holding "
            "its token) and the workers it may use (allowed_workers). Beside or instead "
            "of --api-key-env.",
        ),
    ] = None,
    max_concurrency: Annotated[
        int,
        typer.Option(
            "--max-concurrency",
            min=CONCURRENCY.low,
            max=CONCURRENCY.high,
            help="Requests run at once.",
        ),
    ] = 16,
    max_queue: Annotated[
        int,
        typer.Option(
            "--max-queue",
            min=QUEUE.low,
            max=QUEUE.high,
            help="Requests waiting for a slot; more get 429 Retry-After.",
        ),
    ] = 64,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            "--max-body-bytes",
            min=BODY_BYTES.low,
            max=BODY_BYTES.high,
            help="Largest request body (413 beyond).",
        ),
    ] = 1 << 20,
    grace_s: Annotated[
        float,
        typer.Option(
            "--grace-s",
            min=0.0,
            help="On SIGTERM or Ctrl-C, how long requests in flight may still finish.",
        ),
    ] = 30.0,
    no_cache: NoCacheOption = False,
    state: StateOption = None,
    keep_responses_s: Annotated[
        float,
        typer.Option(
            "--keep-responses-s",
            min=0.0,
            help="How long a stored Responses answer is kept for previous_response_id, "
            "GET and DELETE /v1/responses/ID (in memory, or on the --state server every "
            "replica shares).",
        ),
    ] = 30 * 24 * 3600.0,
    new_budgets: Annotated[
        bool,
        typer.Option(
            "--new-budgets",
            help="With --state: start the keys' budgets from zero if the state server "
            "holds no record of them (its first use, or after it restarted without its "
            "data). Without it, such a server refuses keys with a budget (503), so a "
            "lost record never reopens spending by itself. Give it once, not in a "
            "standing config.",
        ),
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            metavar="ORIGIN",
            help="Let a browser page from ORIGIN (such as http://localhost:3000, or * for "
            "any) call the server; repeat for more. Default: no CORS headers.",
        ),
    ] = None,
    max_k: Annotated[
        int,
        typer.Option(
            "--max-k",
            min=VOTES.low,
            max=VOTES.high,
            help="Largest K of the models vote:K:W, reflect:K:W.",
        ),
    ] = 16,
    max_calls_per_request: Annotated[
        int,
        typer.Option(
            "--max-calls-per-request",
            min=CALLS.low,
            max=CALLS.high,
            help="Most model calls one request makes, all its runs together; a request's "
            "conductor.max_calls may ask fewer.",
        ),
    ] = 64,
    max_usd_per_request: Annotated[
        float | None,
        typer.Option(
            "--max-usd-per-request",
            min=0.0,
            help="Most USD one request spends (calls of unknown price count 0); a "
            "request's conductor.max_usd may ask less.  Default: no ceiling.",
        ),
    ] = None,
    header_timeout_s: Annotated[
        float,
        typer.Option(
            "--header-timeout-s",
            min=0.0,
            help="Close a connection that has not sent a request's headers in this time.",
        ),
    ] = 10.0,
    body_timeout_s: Annotated[
        float,
        typer.Option(
            "--body-timeout-s",
            min=0.0,
            help="Close a connection that has not sent a request's body in this time.",
        ),
    ] = 60.0,
    keep_alive_s: Annotated[
        float,
        typer.Option("--keep-alive-s", min=0.0, help="Close idle kept-alive connections."),
    ] = 5.0,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections",
            min=CONCURRENCY.low,
            max=CONCURRENCY.high,
            help="Connections open at once; beyond it the longest-waiting one without a "
            "request in progress is closed (503 when none).",
        ),
    ] = 512,
    otel: OtelOption = None,
    otel_content: OtelContentOption = False,
    no_otel: NoOtelOption = False,
) -> None:
    """Serve the pool's Conductor and baselines as OpenAI-compatible models
    (GET /v1/models, POST /v1/chat/completions, /v1/responses and /v1/completions)
    until SIGTERM or Ctrl-C."""
    from ..conductors.spec import resolve_conductor
    from ..errors import MissingDependencyError, install_hint
    from ..llm.keys import require_keys
    from ..state import state_url_from

    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise UsageError(
                f"--api-key-env {api_key_env}: the variable is not set; set it to the "
                "token clients must send"
            )
    pool_obj = load_pool(pool)
    cond = resolve_conductor(pool_obj, conductor, cost_weight=cost_weight)
    require_keys([*pool_obj.workers, cond.target])  # every missing key at once, up front
    try:
        from ..serve import ServeSettings, load_keys, run_server
    except ImportError as exc:
        raise MissingDependencyError(
            f"conductor serve needs FastAPI and uvicorn ({exc.name} is missing): "
            f"{install_hint('serve')}"
        ) from None
    api_keys = load_keys(keys, pool_obj) if keys is not None else ()
    state_url = state_url_from(state)
    if new_budgets and state_url is None:
        raise UsageError(
            "--new-budgets starts the budgets' record on a state server: give --state "
            "(without one, budgets are this process's and start from zero at each start)"
        )
    traced = otel_from_options(otel, otel_content, no_otel)

    if router is not None:
        _check_router(router, pool_obj, cond)
    settings = ServeSettings(
        pool=pool_obj,
        conductor=conductor,
        cost_weight=cost_weight,
        router=router,
        records_dir=records,
        otel=traced,
        api_key=api_key,
        max_concurrency=max_concurrency,
        max_queue=max_queue,
        max_body_bytes=max_body_bytes,
        grace_s=grace_s,
        use_cache=not no_cache,
        state=state_url,
        keep_responses_s=keep_responses_s,
        new_budgets=new_budgets,
        keys=api_keys,
        cors_origins=tuple(cors_origin or ()),
        max_k=max_k,
        max_calls_per_request=max_calls_per_request,
        max_usd_per_request=max_usd_per_request,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        keep_alive_s=keep_alive_s,
        max_connections=max_connections,
    )

    def listening(url: str) -> None:
        stderr().print(
            f"conductor serve: listening on {url} (pool {pool_obj.name})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    served = run_server(settings, host=host, port=port, on_listening=listening, conductor=cond)
    stderr().print(
        f"conductor serve: stopped, after serving {plural(served, 'request')}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _check_router(router: Path, pool: Pool, conductor: Conductor) -> None:
    """Refuse, before the server starts, a router that cannot be read or whose arms do
    not run on ``pool`` (the server builds it again, with its own callers)."""
    from ..execute import RunSettings
    from ..llm.caller import CallerSet
    from ..strategies import ConductorStrategy
    from ..strategies.router import ROUTER_PREFIX, router_strategy

    callers = CallerSet(None)
    router_strategy(
        f"{ROUTER_PREFIX}{router}",
        pool,
        callers,
        conductor=lambda: ConductorStrategy(pool, conductor, RunSettings(), callers),
    )
