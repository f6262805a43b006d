"""``conductor train``: GRPO training of a Conductor, with its metrics shown on stderr
as they come (a live table on a terminal, else one line per step)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..bounds import TRAIN_STEPS
from ._common import echo, stderr

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live

    from ..train.metrics import MetricsLine
    from ..train.warmstart import WarmStartReport

__all__ = ["train"]


def train(
    config_file: Annotated[
        Path, typer.Argument(metavar="CONFIG.yaml", help="Training config (configs/train/*.yaml).")
    ],
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            min=TRAIN_STEPS.low,
            max=TRAIN_STEPS.high,
            help="Override grpo.steps (optimizer steps).",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Override output_dir (checkpoint and metrics)."),
    ] = None,
    no_live: Annotated[
        bool,
        typer.Option("--no-live", help="No live table; print one line per step instead."),
    ] = False,
) -> None:
    """Train a Conductor with GRPO on verifiable rewards (needs the train extra).

    Every sampled workflow is executed on the config's pool and graded; the reward is
    0 unparsed, 0.5 parsed but wrong, 1 correct (configurable).  Writes
    OUTPUT_DIR/metrics.jsonl and OUTPUT_DIR/checkpoint, which --conductor PATH loads.
    For several GPUs start it with accelerate launch (see docs/training.md).
    """
    import dataclasses

    from ..train.config import load_train_config

    config = load_train_config(config_file)
    if steps is not None:
        config = dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, steps=steps))
    if output is not None:
        config = dataclasses.replace(config, output_dir=str(output))
    err = stderr()

    from ..train.trainer import METRICS_FILE
    from ..train.trainer import train as run_training

    if not no_live and err.is_terminal:
        table = _LiveTable(err)
        try:
            checkpoint = run_training(
                config, on_metrics=table.add, on_warm_start=lambda w: _print_warm(err, w)
            )
        finally:
            table.stop()
    else:
        checkpoint = run_training(
            config,
            on_metrics=lambda row: _print_line(err, row),
            on_warm_start=lambda w: _print_warm(err, w),
        )
    # Plain echo: paths must not be wrapped or highlighted, scripts copy them.
    echo(f"checkpoint written to {checkpoint}  (use: --conductor {checkpoint})")
    echo(f"metrics written to {Path(config.output_dir).expanduser() / METRICS_FILE}")


def _print_warm(console: Console, report: WarmStartReport) -> None:
    """The format warm start's one line: how much it saw and where its loss went."""
    losses = report.losses
    console.print(
        f"format warm start: {report.examples} replies in {len(losses)} batches, loss "
        f"{losses[0]:.3f} -> {losses[-1]:.3f}, {report.seconds:.0f}s",
        highlight=False,
    )


def _print_line(console: Console, row: MetricsLine) -> None:
    """One metrics line as one line of text."""

    def num(key: str, digits: int = 3) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    console.print(
        f"step {row.get('step')}: reward {num('reward_mean')} ± {num('reward_std')}  "
        f"parsed {num('parse_rate', 2)}  correct {num('correct_rate', 2)}  "
        f"steps/workflow {num('steps_per_workflow', 2)}  loss {num('loss', 4)}  "
        f"{num('elapsed_s', 0)}s",
        highlight=False,
    )


class _LiveTable:
    """A rich table of the last steps, redrawn in place as each metrics line comes.

    The display starts with the first line, so that what the run logs while it loads
    the model is printed plainly before it.
    """

    def __init__(self, console: Console) -> None:
        self._console = console
        self._rows: list[MetricsLine] = []
        self._live: Live | None = None

    def add(self, row: MetricsLine) -> None:
        from ..train.metrics import metrics_table

        self._rows.append(row)
        if self._live is None:
            from rich.live import Live

            self._live = Live(console=self._console, refresh_per_second=2, transient=False)
            self._live.start()
        self._live.update(metrics_table(self._rows))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
