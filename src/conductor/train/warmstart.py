"""The format warm start: a short supervised pass, before GRPO, that teaches the policy
the shape of a Conductor reply (the three lists) and nothing about whom to ask.

Why it exists: GRPO learns only from differences in reward within a group.  A small
base model that never writes a parseable workflow (SmolLM2-135M-Instruct parses 0 of
16 samples on the routing task) scores 0 on every rollout, every advantage is 0, and
nothing is learnt however long the run.  A few supervised steps on workflows whose
workers are drawn *uniformly at random* give it the format while leaving the choice of
worker exactly as uninformed as before; which worker earns the reward is then GRPO's to
discover.

The targets are :func:`conductor.workflow.format_workflow`'s canonical text of random
one- or two-step workflows over each row's listed workers, with subtasks drawn from a
fixed set of generic instructions.  A prompt that ends with a prefill gets the rest of
the canonical text after it (a prefill that the canonical text does not begin with is
refused: the warm start would teach a reply the template never asks for).

On several processes (``accelerate launch``) the warm start is data-parallel: every
process builds the same examples and batches (one seed), each batch's micro-batches are
dealt out in turn (micro-batch ``k`` to process ``k mod N``), and the gradients are
summed over the processes before each optimizer step, so every process takes the very
step one process would take over the whole batch (tests/test_train_multiprocess.py
checks the loss and gradient norm against a one-process run).

Prompts are tokenized by :func:`conductor.llm.checkpoint_client.prompt_token_ids`, the
one rule both GRPO (:mod:`.grpo`) and the checkpoint backend follow, so that the warm
start trains on the very prompt ids GRPO samples from and inference sends.  torch is
imported inside the function.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..conductors.prompt import conductor_prefill
from ..errors import UsageError
from ..llm.checkpoint_client import prompt_token_ids
from ..workflow import ALL, Step, Workflow, format_workflow
from .policy import world_size
from .settings import DEFAULT_MICRO_BATCH, WarmStartSettings

__all__ = ["WarmStartReport", "format_warm_start", "warm_start_target"]

# Instructions with no hint of the task or of a worker: the warm start must teach the
# reply's shape only.
_FIRST_SUBTASKS = (
    "Answer the question.",
    "Solve the problem and state the final answer.",
    "Work through the question step by step and give the answer.",
)
_CHECK_SUBTASK = "Check the answer above, correct it if needed and give the final answer."
# The share of one-step targets; the rest have a second step that checks the first.
_ONE_STEP_SHARE = 0.75


@dataclass(frozen=True)
class WarmStartReport:
    """What the warm start did: examples seen, the loss of each batch and the norm of its
    gradient (over every process), seconds taken, and over how many processes."""

    examples: int
    losses: tuple[float, ...]
    seconds: float
    grad_norms: tuple[float, ...] = ()
    processes: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "losses": list(self.losses),
            "grad_norms": list(self.grad_norms),
            "seconds": self.seconds,
            "processes": self.processes,
        }


def warm_start_target(
    rng: random.Random, n_workers: int, max_steps: int, prefill: str | None = None
) -> str:
    """One warm-start reply: a random workflow over ``n_workers`` listed workers, as the
    policy writes it after ``prefill`` (the template's opening of its reply, if any)."""
    if n_workers < 1:
        raise UsageError("the warm start needs at least one worker in each prompt")
    steps = [Step(rng.randrange(n_workers), rng.choice(_FIRST_SUBTASKS), ())]
    if max_steps >= 2 and rng.random() >= _ONE_STEP_SHARE:
        steps.append(Step(rng.randrange(n_workers), _CHECK_SUBTASK, ALL))
    text = format_workflow(Workflow(steps=tuple(steps)))
    if not prefill:
        return text
    if not text.startswith(prefill):
        raise UsageError(
            f"warm_start: the template's reply prefill {prefill[:40]!r} is not the start of "
            f"the canonical workflow text ({text[:40]!r}...); a warm start would teach a "
            "reply the template does not ask for: remove warm_start or change the prefill"
        )
    return text[len(prefill) :]


def format_warm_start(
    model: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    settings: WarmStartSettings,
    *,
    max_steps: int,
    seed: int,
    micro_batch: int = DEFAULT_MICRO_BATCH,
) -> WarmStartReport:
    """Train ``model`` in place on random-workflow replies to ``rows``' prompts.

    ``rows`` are :func:`conductor.train.dataset.build_rows` rows (their ``prompt`` the
    Conductor messages, ``worker_ids`` the workers listed).  Each row is used
    ``settings.passes`` times, each time with a fresh random workflow; batches of
    ``settings.batch_size`` are shuffled with ``random.Random(seed)`` and scored in
    micro-batches of ``micro_batch`` sequences (the trainer passes GRPO's, so that one
    setting bounds the activations of both phases; the update does not depend on it).
    The model is left in eval mode, with no gradients, and the optimizer's memory is
    handed back to the operating system before returning.
    """
    if micro_batch < 1:
        raise UsageError(f"warm_start: the micro-batch must be at least 1, not {micro_batch}")
    import torch

    rank, world, reduce = _process_group()
    if not rows:
        raise UsageError("warm_start: there are no training rows")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    examples: list[tuple[list[int], list[int]]] = []
    eos = tokenizer.eos_token_id
    for _ in range(settings.passes):
        for row in rows:
            messages = row["prompt"]
            prompt_ids = prompt_token_ids(tokenizer, [dict(m) for m in messages])
            target = warm_start_target(
                rng, len(row["worker_ids"]), max_steps, conductor_prefill(messages)
            )
            target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
            examples.append((prompt_ids, [*target_ids, eos]))
    rng.shuffle(examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    losses: list[float] = []
    norms: list[float] = []
    params = [p for p in model.parameters() if p.requires_grad]
    started = time.monotonic()
    model.train()
    try:
        device = next(model.parameters()).device
        for start in range(0, len(examples), settings.batch_size):
            batch = examples[start : start + settings.batch_size]
            # The model shifts labels by one: a reply of n tokens is n scored tokens.
            scored = sum(len(t) for _p, t in batch)
            optimizer.zero_grad()
            total = 0.0
            # Micro-batches, as GRPO's (the activations of one are the memory peak); each
            # chunk's mean loss weighted by its share of the batch's scored tokens, so the
            # gradient is the whole batch's token mean.
            chunk_starts = range(0, len(batch), micro_batch)
            for number, chunk_start in enumerate(chunk_starts):
                if number % world != rank:
                    continue  # another process's micro-batch
                chunk = batch[chunk_start : chunk_start + micro_batch]
                width = max(len(p) + len(t) for p, t in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                labels = torch.full((len(chunk), width), -100, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, (p, t) in enumerate(chunk):
                    seq = p + t
                    ids[i, : len(seq)] = torch.tensor(seq)
                    labels[i, len(p) : len(seq)] = torch.tensor(t)  # the reply only
                    mask[i, : len(seq)] = 1
                share = sum(len(t) for _p, t in chunk) / scored
                loss = model(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    labels=labels.to(device),
                ).loss
                (loss * share).backward()
                total += float(loss.item()) * share
            if reduce is not None:
                total = _sum_over_processes(reduce, params, total)
            norms.append(round(float(torch.nn.utils.get_total_norm([p.grad for p in params])), 6))
            optimizer.step()
            losses.append(round(total, 6))
    finally:
        model.eval()
        # The moments are twice the model and the gradients once more: GRPO builds its
        # own optimizer, so neither is kept.  Freed is not returned: glibc keeps the
        # many parameter-sized blocks in its heaps, and GRPO's own state would then be
        # allocated beside them (the process's peak would be both phases' state).
        model.zero_grad(set_to_none=True)
        del optimizer
        _return_freed_memory()
    return WarmStartReport(
        examples=len(examples),
        losses=tuple(losses),
        seconds=round(time.monotonic() - started, 1),
        grad_norms=tuple(norms),
        processes=world,
    )


def _return_freed_memory() -> None:
    """Hand memory that Python and torch have freed back to the operating system.

    ``malloc_trim`` asks glibc to release the free pages of every heap (not only the
    top of the main one); other C libraries (musl, macOS) return large blocks on free
    and have no such call, so there it is skipped."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return  # not glibc
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def _process_group() -> tuple[int, int, Callable[[Any], None] | None]:
    """``(rank, processes, sum_in_place)`` of this launch; ``sum_in_place`` (an all-reduce
    over the processes) is None for a single process.

    torch.distributed is set up through accelerate's shared state, the one TRL's trainer
    uses afterwards (gloo on CPUs, NCCL on GPUs), so the warm start and GRPO share one
    process group."""
    if world_size() <= 1:
        return 0, 1, None
    import torch
    from accelerate import PartialState

    state = PartialState()
    if state.num_processes <= 1:
        return 0, 1, None
    device = state.device

    def sum_in_place(tensor: Any) -> None:
        # NCCL reduces GPU tensors only: the warm start's model is on the CPU.
        on_device = tensor.to(device)
        torch.distributed.all_reduce(on_device, op=torch.distributed.ReduceOp.SUM)
        if on_device is not tensor:
            tensor.copy_(on_device)

    return state.process_index, state.num_processes, sum_in_place


def _sum_over_processes(reduce: Callable[[Any], None], params: Sequence[Any], loss: float) -> float:
    """Sum each parameter's gradient, and the batch loss, over the processes (a process
    that scored no micro-batch of this batch adds zeros); return the summed loss."""
    import torch

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        reduce(p.grad)
    total = torch.tensor([loss], dtype=torch.float64)
    reduce(total)
    return float(total.item())
