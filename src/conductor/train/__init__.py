"""``conductor train``: GRPO training of a Conductor on verifiable rewards.

The pieces, importable from here (loaded on first use, so ``import conductor.train``
stays cheap and never pulls in torch or TRL):

* :mod:`.config`: the training config file (``load_train_config``; its types in
  :mod:`.settings`: ``TrainConfig``, ...);
* :mod:`.contamination`: the held-out guard (no test question is trained on);
* :mod:`.pools`: randomised sub-pools (``sample_subpool``, ``map_back``, ...);
* :mod:`.dataset`: the rows GRPO trains on (``build_rows``);
* :mod:`.reward`: the reward that executes and grades workflows (``WorkflowReward``);
* :mod:`.recursion`: forced second rounds (``revision_messages``, ``first_round``);
* :mod:`.trainer`: the training loop itself (torch and TRL), with the policy model and
  its prompts in :mod:`.policy`, the on-policy recursion trainer in
  :mod:`.grpo_recursion`, and the metrics lines it hands to ``on_metrics`` in
  :mod:`.metrics`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DataMix",
    "GRPOSettings",
    "PoolSampling",
    "RecursionSettings",
    "RewardSettings",
    "RolloutResult",
    "SubPool",
    "TrainConfig",
    "TrainConfigError",
    "WorkflowReward",
    "build_rows",
    "first_round",
    "load_train_config",
    "load_train_pool",
    "map_back",
    "revision_messages",
    "sample_subpool",
    "score_record",
    "training_conductor",
]

_WHERE = {
    "DataMix": "config",
    "GRPOSettings": "config",
    "PoolSampling": "config",
    "RecursionSettings": "config",
    "RewardSettings": "config",
    "TrainConfig": "config",
    "TrainConfigError": "config",
    "load_train_config": "config",
    "SubPool": "pools",
    "load_train_pool": "pools",
    "map_back": "pools",
    "sample_subpool": "pools",
    "training_conductor": "pools",
    "build_rows": "dataset",
    "RolloutResult": "reward",
    "WorkflowReward": "reward",
    "score_record": "reward",
    "first_round": "recursion",
    "revision_messages": "recursion",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
