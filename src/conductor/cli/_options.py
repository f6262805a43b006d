"""The options ``ask``, ``bench`` and ``serve`` share, each declared once: one name, one
help text and one range for every command that takes it (the tracing options, which
these three share too, are :mod:`._tracing`'s).

Each is a typer ``Annotated`` alias; a command gives its default in its signature.
Only typer is imported here, so that ``--help`` stays instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..bounds import CALLS, ROUNDS, STEPS

__all__ = [
    "BudgetUsdOption",
    "ConductorOption",
    "CostWeightOption",
    "MaxCallsOption",
    "MaxStepsOption",
    "NoCacheOption",
    "StateOption",
    "PoolOption",
    "RoundsOption",
    "StrategyOption",
]

#: ``--pool``: the pool a command runs.
PoolOption = Annotated[
    str | None,
    typer.Option(
        "--pool",
        "-p",
        help="Pool file, or the name of a shipped pool. Default: the embedded offline "
        "pool (local); with bench --resume, the run's own.",
    ),
]
#: ``--conductor``: who writes the workflows.
ConductorOption = Annotated[
    str | None,
    typer.Option(
        "--conductor",
        "-c",
        help="Who writes the workflows: http(s)://HOST/v1[#MODEL], prompted:WORKER_ID, "
        "prompted:LITELLM_MODEL, local, hf:ORG/NAME or a checkpoint directory. "
        "Default: the pool's conductor.",
    ),
]
#: ``--cost-weight``: a cost-conditioned Conductor's point on its accuracy-cost front.
CostWeightOption = Annotated[
    float | None,
    typer.Option(
        "--cost-weight",
        min=0.0,
        metavar="W",
        help="For a Conductor trained with reward.cost_weights: state this weight per US "
        "dollar in its prompt (higher: cheaper workflows). Refused for a checkpoint "
        "trained without it. Default: no weight in the prompt.",
    ),
]
#: ``--strategy``: how a question is answered.
StrategyOption = Annotated[
    str | None,
    typer.Option(
        "--strategy",
        help="conductor, single:WORKER, vote:K:WORKER (a majority of the replies' short "
        "final answers), moa, moa:AGGREGATOR, reflect:K:WORKER, router:DIR (a fitted "
        "router picks one of these per question), or with bench singles (every worker "
        "alone).  Default: conductor.",
    ),
]
#: ``--max-steps``: the most steps of a workflow.
MaxStepsOption = Annotated[
    int | None,
    typer.Option(
        "--max-steps",
        min=STEPS.low,
        max=STEPS.high,
        help="Most steps per workflow, per question.",
    ),
]
#: ``--rounds``: the most Conductor rounds (``None``: 1, or a resumed run's own).
RoundsOption = Annotated[
    int | None,
    typer.Option(
        "--rounds",
        min=ROUNDS.low,
        max=ROUNDS.high,
        help="Most Conductor rounds per question (default 1); above 1 the Conductor may revise.",
    ),
]
#: ``--budget-usd``: a question's spend limit.
BudgetUsdOption = Annotated[
    float | None,
    typer.Option(
        "--budget-usd", min=0.0, help="Per question: stop starting calls past this spend."
    ),
]
#: ``--max-calls``: a question's call limit.
MaxCallsOption = Annotated[
    int | None,
    typer.Option(
        "--max-calls",
        min=CALLS.low,
        max=CALLS.high,
        help="Most model calls per question, the Conductor's included.",
    ),
]
#: ``--state URL``: what processes share (the call cache) on a Redis-protocol server.
StateOption = Annotated[
    str | None,
    typer.Option(
        "--state",
        metavar="URL",
        help="Keep the call cache on this Redis-protocol server (redis://HOST:PORT/DB, "
        "rediss:// for TLS), shared by every process that names it; default: "
        "$CONDUCTOR_STATE_URL, else this machine's cache directory.",
    ),
]
#: ``--no-cache``: the call cache off.
NoCacheOption = Annotated[
    bool, typer.Option("--no-cache", help="Neither read nor write the call cache.")
]
