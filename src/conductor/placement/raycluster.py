"""Work placed on a Ray cluster: code grading and whole samples as Ray tasks.

:func:`connect` joins the cluster a user names (``ray://``-less address such as
``127.0.0.1:6379``, or ``auto``).  Two kinds of task go there:

* **grading** (:class:`RayGrader`): a :class:`~conductor.grading.Grader` whose
  ``grade`` runs the same grader, built from the same name and options, on a node
  holding one unit of the custom resource :data:`SANDBOX_RESOURCE`.  A node declares it
  (``ray start --resources '{"sandbox": N}'``) only where bubblewrap is installed, so
  model-written code never runs on a node that cannot confine it; a cluster without the
  resource is refused at :func:`connect`, not left waiting forever.  The verdict comes
  back as its dict and is rebuilt as the same :class:`Verdict`: the grade is identical
  to one made locally, only the machine differs.
* **samples** (:class:`RayStrategy`): a :class:`~conductor.strategies.Strategy` whose
  ``run`` runs one sample's strategy on a node.  The node builds the real strategy once
  per worker process from a picklable factory the caller gives (the benchmark runner
  gives its own builder, so nothing of a sample's logic is written here), and returns
  the :class:`RunRecord`.  Everything the run directory's config records (name,
  description, targets) is read from a copy built on the driver, which never runs.

Each task is retried on another node when its node dies (``max_retries``); a task that
raised is not retried (its exception is the sample's fault, as in one process).  Tasks
return values and write nothing: the driver stays the only writer of a run directory.

``ray`` is imported on first use only, and only here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import MissingDependencyError, UsageError, install_hint
from ..grading import Grader, get_grader
from ..grading.types import Sample, Verdict
from ..llm.answer_format import PLAIN, AnswerFormat

if TYPE_CHECKING:
    from ..events import EventSink
    from ..pool import Pool
    from ..record import RunRecord
    from ..steps import Budget
    from ..strategies import CallPlan, Strategy
    from ..targets import Worker

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "SANDBOX_RESOURCE",
    "RayGrader",
    "RayStrategy",
    "connect",
    "disconnect",
    "sandbox_slots",
]

#: The custom resource a node declares where it can run model-written code (bubblewrap).
SANDBOX_RESOURCE = "sandbox"
#: How often a task is run again after its node (or worker process) died.
DEFAULT_MAX_RETRIES = 3

_T = TypeVar("_T")


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            f"--ray needs the package 'ray', which is not installed: {install_hint('ray')}"
        ) from None
    return ray


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine belongs to),
    once per process; a cluster that cannot be reached is one sentence."""
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            # The nodes' output stays in their logs: nothing below the CLI prints here.
            log_to_driver=False,
            include_dashboard=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(f"--ray {address}: cannot join the Ray cluster ({exc})") from None


def disconnect() -> None:
    """Leave the cluster this process joined (nothing when it joined none)."""
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()


def sandbox_slots() -> int:
    """How many code grades the cluster runs at once: its :data:`SANDBOX_RESOURCE`
    units.  Refuses a cluster with none, whose grading tasks would wait forever."""
    units = int(_ray().cluster_resources().get(SANDBOX_RESOURCE, 0))
    if units < 1:
        raise UsageError(
            f"the Ray cluster has no node with the resource {SANDBOX_RESOURCE!r}, which a "
            "node declares where bubblewrap is installed "
            f"(ray start --resources '{{\"{SANDBOX_RESOURCE}\": N}}'); code cannot be graded"
        )
    return units


# -- grading ---------------------------------------------------------------------

# A worker process keeps each grader it built (a code grader keeps warm helpers).
_node_graders: dict[str, Grader] = {}
_node_lock = threading.Lock()


def _grade_on_node(
    name: str, options: dict[str, Any], response: str | None, sample: Sample
) -> dict[str, Any]:
    """A grading task's body, run on a node: the grader ``name`` built with
    ``options`` grades ``response``; the verdict returns as its dict."""
    held = _ray().get_runtime_context().get_assigned_resources()
    if held.get(SANDBOX_RESOURCE, 0) <= 0:
        # A task started without the resource (a caller that left it out) may be on a
        # node that cannot confine the code: it is not run there.
        return Verdict(
            "grader_error", f"not graded: this task holds no {SANDBOX_RESOURCE!r} resource"
        ).to_dict()
    key = json.dumps([name, options], sort_keys=True, default=str)
    with _node_lock:
        grader = _node_graders.get(key)
        if grader is None:
            grader = _node_graders[key] = get_grader(name, options)
    return grader.grade(response, sample).to_dict()


def _verdict(data: dict[str, Any]) -> Verdict:
    """The verdict a task returned, as the grader made it (``score`` is derived)."""
    return Verdict(
        status=data["status"],
        reason=data["reason"],
        extracted=data["extracted"],
        detail=data["detail"],
    )


class RayGrader:
    """The grader ``name`` (with ``options``), each grade run as a Ray task on a node
    with a :data:`SANDBOX_RESOURCE` unit.  Its name and version are the local grader's
    (built unwarmed, so it starts nothing here): a run's config is the same either way.
    ``grade`` blocks until the verdict is back, as every grader may."""

    def __init__(
        self, name: str, options: dict[str, Any], *, max_retries: int = DEFAULT_MAX_RETRIES
    ) -> None:
        local = get_grader(name, options, warm=False)
        self.name: str = local.name
        self.version: str = local.version
        self._spec = (name, dict(options))
        # A sandbox unit and no CPU: a grade mostly waits on its sandboxed process, and
        # the units a node declares are the grades it runs at once.
        self._remote = (
            _ray()
            .remote(_grade_on_node)
            .options(resources={SANDBOX_RESOURCE: 1}, num_cpus=0, max_retries=max_retries)
        )

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        name, options = self._spec
        ref = self._remote.remote(name, options, response, sample)
        return _verdict(_ray().get(ref))


# -- samples ---------------------------------------------------------------------


class _NodeLoop:
    """One event loop per worker process, on a thread of its own, where the node's
    strategy lives: its HTTP sessions are bound to the loop that opened them, so every
    sample the process runs must run on that same loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="conductor-ray", daemon=True)
        thread.start()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_node_loop: _NodeLoop | None = None
_node_strategies: dict[str, Strategy] = {}


def _run_on_node(
    factory: Callable[[], Strategy],
    token: str,
    question: str,
    sample_index: int,
    sample_id: str | None,
    epoch: int | None,
    answer_format: AnswerFormat,
) -> RunRecord:
    """A sample task's body, run on a node: the strategy ``factory`` builds (once per
    worker process and run, ``token`` naming the run) answers ``question``."""
    global _node_loop
    with _node_lock:
        if _node_loop is None:
            _node_loop = _NodeLoop()
        loop = _node_loop
        strategy = _node_strategies.get(token)
        if strategy is None:
            strategy = _node_strategies[token] = factory()
    return loop.run(
        strategy.run(
            question,
            sample_index=sample_index,
            sample_id=sample_id,
            epoch=epoch,
            answer_format=answer_format,
        )
    )


class RayStrategy:
    """``local`` (the strategy as the driver built it: its name, description and
    targets are the run's), each run sent to the cluster as a task in which the strategy
    ``factory`` builds on the node answers.  ``factory`` must be picklable (a module
    function and its arguments); it is called once per worker process."""

    def __init__(
        self,
        local: Strategy,
        factory: Callable[[], Strategy],
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        self._local = local
        self._factory = factory
        # Which run a node's cached strategy belongs to: a worker process may serve
        # several runs of one driver (bench runs several strategies in turn).
        self._token = uuid.uuid4().hex
        self.name: str = local.name
        self._remote = (
            _ray()
            .remote(_run_on_node)
            .options(num_cpus=1, max_retries=max_retries, retry_exceptions=False)
        )

    # Everything but running is the local strategy's: what the run's config records,
    # what a key check and the concurrency default read.

    @property
    def pool(self) -> Pool:
        return self._local.pool

    @property
    def targets(self) -> tuple[Worker, ...]:
        return self._local.targets

    @property
    def call_demand(self) -> tuple[tuple[Worker, int], ...]:
        return self._local.call_demand

    @property
    def call_roles(self) -> tuple[tuple[str, Worker], ...]:
        return self._local.call_roles

    def planned_calls(self, question: str, *, workflow_steps: int) -> CallPlan | None:
        return self._local.planned_calls(question, workflow_steps=workflow_steps)

    def describe(self) -> dict[str, Any]:
        return self._local.describe()

    def answer_refusal(self, answer: AnswerFormat) -> str | None:
        return self._local.answer_refusal(answer)

    async def run(
        self,
        question: str,
        *,
        sample_index: int,
        sample_id: str | None = None,
        epoch: int | None = None,
        events: EventSink | None = None,
        on_record: Callable[[RunRecord], None] | None = None,
        budget: Budget | None = None,
        answer_format: AnswerFormat = PLAIN,
    ) -> RunRecord:
        """Run ``question`` on a node.  What lives in this process (``events``,
        ``on_record``, a ``budget`` shared by runs) cannot follow it there: refused."""
        if events is not None or on_record is not None or budget is not None:
            raise ValueError("a run on a Ray node takes no events, on_record or budget")
        ref = self._remote.remote(
            self._factory, self._token, question, sample_index, sample_id, epoch, answer_format
        )
        record: RunRecord = await ref
        return record

    async def aclose(self) -> None:
        await self._local.aclose()
