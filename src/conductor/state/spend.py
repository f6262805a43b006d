"""``--max-usd`` across processes: one spend counter per run on the state server.

:class:`SharedSpendMeter` is the :class:`~conductor.llm.cost.SpendMeter` the callers
charge, so each call paid for is added to the run's counter (``INCRBYFLOAT`` in the
session, :mod:`conductor.state.claims`) as it is charged, and :meth:`refusal` reads the
counter all processes add to.  The first process seeds it once from what the records
already cost.

It fails closed: a charge or a read the server does not answer (or a session it no
longer holds) leaves :attr:`RunClaims.lost` set and refuses every later sample, which
the runner turns into its stop; spend is never counted locally in its place.
"""

from __future__ import annotations

from ..llm.cost import SpendMeter
from .claims import RunClaims, StateLost

__all__ = ["SharedSpendMeter"]


class SharedSpendMeter(SpendMeter):
    """The run's spend as the server counts it, against ``cap_usd``."""

    def __init__(self, cap_usd: float | None) -> None:
        super().__init__(cap_usd)
        self.claims: RunClaims | None = None

    def attach(self, claims: RunClaims | None) -> None:
        """Count on the run's session from now on (the runner attaches it once the run
        is claimed or joined; no call is made before)."""
        self.claims = claims

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
