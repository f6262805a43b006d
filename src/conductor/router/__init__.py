"""The learned router tier: a question in, the strategy to answer it with out.

A router is fitted on bench runs of several strategies over the same questions (a
``singles`` run is every worker alone; fixed workflows and the Conductor may stand
beside them), from features of the question alone, and measured on questions held out
of its fit.  It is then a strategy like the others (``--strategy router:DIR``).

- :mod:`.data`: the runs read into one table of scores and costs (:func:`read_routing_data`);
- :mod:`.features`: what the router sees of a question (a registry of featurizers);
- :mod:`.head`: one logistic regression per arm, in numpy;
- :mod:`.model`: the fitted :class:`Router` and its decision (cost weight, cascade);
- :mod:`.fit`: the split, the fit, the held-out measures (:func:`fit_router`);
- :mod:`.store`: the router directory (:func:`save_router`, :func:`load_router`).

numpy is the only library it needs; nothing here is imported by a command that does not
route.
"""

from __future__ import annotations

from .data import RoutingData, read_routing_data
from .fit import Comparison, FitSettings, FrontierPoint, Policy, RouterFit, fit_router, held_out
from .model import Route, Router
from .store import ROUTER_FILE, RouterDir, RouterFileError, load_router, save_router

__all__ = [
    "ROUTER_FILE",
    "Comparison",
    "FitSettings",
    "FrontierPoint",
    "Policy",
    "Route",
    "Router",
    "RouterDir",
    "RouterFileError",
    "RouterFit",
    "RoutingData",
    "fit_router",
    "held_out",
    "load_router",
    "read_routing_data",
    "save_router",
]
