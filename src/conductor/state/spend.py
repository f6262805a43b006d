"""``--max-usd`` across processes: one spend counter per run on the state server.

:class:`SharedSpendMeter` is the :class:`~conductor.llm.cost.SpendMeter` the callers
charge, so each call paid for is added to the run's counter (``INCRBYFLOAT`` in the
session, :mod:`conductor.state.claims`) as it is charged, and :meth:`refusal` reads the
counter all processes add to.  The first process seeds it once from what the records
already cost.

It fails closed: a charge or a read the server does not answer (or a session it no
longer holds) leaves :attr:`RunClaims.lost` set and refuses every later sample, which
the runner turns into its stop; spend is never counted locally in its place.

``bench --ray`` makes the calls on the cluster's nodes, not in the process that runs
the samples: :meth:`SharedSpendMeter.remote` names the run's counter to them
(:class:`RunSpend`, picklable: the server and the session's token, no connection), and
each node's callers charge it through a :class:`NodeSpendMeter`.  The driver's
:meth:`~SharedSpendMeter.refusal`, read before each sample it places, then sees what
the nodes spent.  A node fails closed too: it reads the server before each call, and
once the server does not answer it makes no call at all.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..llm.cost import SpendMeter
from .claims import RunClaims, StateLost
from .url import StateURL

__all__ = ["NodeSpendMeter", "RunSpend", "SharedSpendMeter"]


@dataclass(frozen=True)
class RunSpend:
    """The spend counter of the run session ``token`` on the server at ``url``, as a
    process that does not run the run names it (a Ray node)."""

    url: StateURL
    token: str


class SharedSpendMeter(SpendMeter):
    """The run's spend as the server counts it, against ``cap_usd``."""

    def __init__(self, cap_usd: float | None) -> None:
        super().__init__(cap_usd)
        self.claims: RunClaims | None = None

    def attach(self, claims: RunClaims | None) -> None:
        """Count on the run's session from now on (the runner attaches it once the run
        is claimed or joined; no call is made before)."""
        self.claims = claims

    def remote(self) -> RunSpend | None:
        """The run's counter, for the processes that make its calls elsewhere (``None``
        until the run's session is attached)."""
        claims = self.claims
        return RunSpend(claims.url, claims.token) if claims is not None else None

    def charge(self, usd: float | None) -> None:
        if not usd:
            return
        if self.claims is None:
            super().charge(usd)
            return
        try:
            self.spent_usd = self.claims.charge(usd)
        except StateLost:
            # Remembered in ``claims.lost``; the runner stops on it before the next
            # sample (a caller in the middle of a sample is no place to raise).
            self.spent_usd += usd

    def refusal(self) -> str | None:
        if self.claims is None:
            return super().refusal()
        if self.claims.lost is not None:
            return None  # not a cap: the runner's state stop says why
        try:
            self.spent_usd = self.claims.spent()
        except StateLost:
            return None
        return super().refusal()


class NodeSpendMeter(SpendMeter):
    """The meter of a process that makes a run's calls but runs none of its samples (a
    Ray node): each call paid for is charged to the run's counter, ``spend``.  The cap
    is the driver's to apply (it stops placing samples); here a call is refused only
    when its spend could not be counted: the server did not answer a read before it, or
    a charge, or no longer holds the session.  Nothing is counted locally in its place.
    """

    def __init__(self, spend: RunSpend) -> None:
        super().__init__(None)
        # Its own view of the session: no heartbeat (it holds no lease), no join (a
        # charge and a read check the session is alive on the server themselves).
        self.claims = RunClaims(spend.url, spend.token)

    def charge(self, usd: float | None) -> None:
        if not usd or self.claims.lost is not None:
            return
        # A charge not answered is remembered in ``claims.lost``: every later call is
        # refused.
        with contextlib.suppress(StateLost):
            self.spent_usd = self.claims.charge(usd)

    def call_refusal(self) -> str | None:
        if self.claims.lost is None:
            with contextlib.suppress(StateLost):  # remembered in ``claims.lost``
                self.spent_usd = self.claims.spent()
        lost = self.claims.lost
        if lost is None:
            return None
        return f"not called: {lost}, so its spend could not be counted against --max-usd"

    def close(self) -> None:
        self.claims.close()
