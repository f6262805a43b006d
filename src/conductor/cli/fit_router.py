"""``conductor fit-router``: a router from bench runs of several strategies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..bounds import SEED
from ..errors import UsageError
from ..text import printable
from ..userfiles import check_regular, resolved
from ._common import echo, print_path, stderr, stdout

__all__ = ["fit_router"]


def fit_router(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Bench run directories of the same questions: a singles run (every "
            "worker alone), and any runs of fixed workflows (moa, vote:K:W, reflect:K:W) "
            "or of the Conductor beside it.",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="The router directory to write.", file_okay=False),
    ],
    cost_weight: Annotated[
        float,
        typer.Option(
            "--cost-weight",
            help="Accuracy given up per USD a question saves (0: route for accuracy alone).",
            min=0.0,
        ),
    ] = 0.0,
    holdout: Annotated[
        float,
        typer.Option(
            "--holdout",
            help="The share of questions held out of the fit and measured on (the split "
            "is by question, fixed by --seed).",
        ),
    ] = 0.3,
    fallback: Annotated[
        str | None,
        typer.Option(
            "--fallback",
            help="A cascade: the strategy (an arm of the runs, e.g. conductor) a question "
            "goes to when the router is unsure of every other arm.",
        ),
    ] = None,
    features: Annotated[
        str,
        typer.Option(
            "--features",
            help="What the router reads of a question: hashed-ngrams-v1 (words and "
            "characters, no model) or gguf-mean-v1 (a small model's hidden states; the "
            "embedded SmolLM2 unless --features-model).",
        ),
    ] = "hashed-ngrams-v1",
    features_model: Annotated[
        Path | None,
        typer.Option(
            "--features-model",
            help="gguf-mean-v1: the GGUF file whose hidden states are the features.",
            dir_okay=False,
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", min=SEED.low, max=SEED.high, help="The split's and the folds' seed."
        ),
    ] = 0,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a router already in --out.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the held-out figures as JSON on stdout.")
    ] = False,
) -> None:
    """Fit a router that sends each question to the strategy expected to answer it best
    (at the cost weight given), measure it on held-out questions, and write it to --out
    for bench/ask --strategy router:DIR."""
    from ..router import ROUTER_FILE, FitSettings, read_routing_data, save_router
    from ..router import fit_router as fit_on

    target = out.expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out {printable(str(out))}: not a directory")
    if (target / ROUTER_FILE).exists() and not overwrite:
        raise UsageError(
            f"--out {printable(str(out))} already holds a router: give --overwrite to replace it"
        )
    if target.is_dir() and any(target.iterdir()) and not (target / ROUTER_FILE).exists():
        raise UsageError(
            f"--out {printable(str(out))} is a directory that holds other files: name a new "
            "or empty one"
        )
    feature_settings: dict[str, object] = {}
    if features_model is not None:
        if features != "gguf-mean-v1":
            raise UsageError("--features-model goes with --features gguf-mean-v1")
        check_regular(features_model.expanduser(), "model file")  # a FIFO, a looping link
        feature_settings["model"] = str(resolved(features_model))
    data = read_routing_data(runs)
    settings = FitSettings(
        cost_weight=cost_weight,
        holdout=holdout,
        seed=seed,
        fallback=fallback,
        features=features,
        feature_settings=feature_settings,
    )
    fit = fit_on(data, settings)
    written = save_router(fit, target)
    if as_json:
        echo(json.dumps(fit.evaluation(), indent=2))
    else:
        from ..render.router import fit_view

        stdout().print(fit_view(fit))
    print_path(stderr(), "router written to (use it with --strategy router:DIR)", written.parent)
