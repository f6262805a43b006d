"""Resolving which model writes the workflows.

Every Conductor backend is reduced to a model target (a :class:`~conductor.pool.Worker`
named ``conductor``) that the usual call layer drives, plus the prompt settings:

- ``endpoint``: an OpenAI-compatible server, e.g. vLLM serving a trained checkpoint;
- ``prompted``: a pool worker, or any litellm model, asked to act as Conductor;
- ``local``: the embedded llama.cpp model (constrained decoding on by default);
- ``checkpoint``: a trained model directory or ``hf:ORG/NAME`` loaded in-process.

The ``--conductor SPEC`` shorthand (its forms: the options of ``ask`` under "Using real
providers" in the README) is parsed by :func:`parse_conductor_spec`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..pool import Pool, pool_to_public_dict
from ..targets import ClientKind, ConductorConfig, Worker

__all__ = ["SAMPLING_KEYS", "Conductor", "parse_conductor_spec", "resolve_conductor"]

log = logging.getLogger("conductor")


@dataclass(frozen=True)
class Conductor:
    """A ready-to-use Conductor: the model target plus how to prompt and parse it."""

    backend: str
    target: Worker
    template: str = "default"
    max_steps: int = 5
    parse_retries: int = 5
    show_descriptions: bool = False
    constrained: bool = False
    max_reasoning_chars: int = 600
    min_subtask_chars: int = 1
    max_subtask_chars: int = 300
    # The instructions a constrained Conductor chooses from (empty: it writes its own).
    subtasks: tuple[str, ...] = ()
    # A cost-conditioned Conductor's weight per US dollar, stated in its prompt by
    # ``cost_weight_line`` (None: no such line, the prompt of every other Conductor).
    cost_weight: float | None = None

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description for run records (no secrets).

        ``sampling`` holds the Conductor's temperature, max_tokens and top_p as sent
        (``None``: the server's default); ``template_form`` is ``text`` or ``chat``.
        """
        import hashlib

        from .prompt import load_conductor_template

        target = pool_to_public_dict(Pool(name="conductor", workers=(self.target,)))
        template = load_conductor_template(self.template)
        described: dict[str, Any] = {
            "backend": self.backend,
            "target": target["workers"][0],
            "template": self.template,
            "template_sha256": hashlib.sha256(template.text.encode()).hexdigest(),
            "template_form": template.form,
            "sampling": {k: self.target.params.get(k) for k in SAMPLING_KEYS},
            "max_steps": self.max_steps,
            "parse_retries": self.parse_retries,
            "show_descriptions": self.show_descriptions,
            "constrained": self.constrained,
            "grammar_bounds": [
                self.max_reasoning_chars,
                self.min_subtask_chars,
                self.max_subtask_chars,
            ],
        }
        # Only when set, so that the records (and resume keys) of Conductors without a
        # choice of subtasks read as they always have.
        if self.subtasks:
            described["subtasks"] = list(self.subtasks)
        # Likewise: another weight is another prompt, so another run (and resume key).
        if self.cost_weight is not None:
            described["cost_weight"] = self.cost_weight
        return described

    def check_prefill(self) -> None:
        """Refuse a template whose replies begin with a prefill when this Conductor's
        model cannot continue a reply (:class:`UsageError` naming the template)."""
        from ..llm.prefill import continuation, continues_in_template, unsupported_reason
        from .prompt import load_conductor_template

        chat = load_conductor_template(self.template).chat
        if chat is None or not chat.has_prefill:
            return
        # An in-process checkpoint continues it through its tokenizer's chat template.
        if not continues_in_template(self.target) and continuation(self.target) is None:
            why = unsupported_reason(self.target)
            raise UsageError(
                f"template {self.template!r} begins the Conductor's reply with a prefill, "
                f"but the Conductor ({self.target.client} model {self.target.model!r}) cannot "
                f"continue a reply: {why}; serve it from an OpenAI-compatible server such as "
                "vLLM (api_base), run it as a checkpoint or an Anthropic model, or use a "
                "template without `prefill`"
            )


_URL = re.compile(r"^https?://", re.IGNORECASE)
#: The Conductor's sampling settings, set in the pool's ``conductor:`` section (or a
#: checkpoint's ``conductor.json``) and recorded with every run.
SAMPLING_KEYS = ("temperature", "max_tokens", "top_p")


def _sampling(cfg: ConductorConfig) -> dict[str, Any]:
    """The sampling settings ``cfg`` sets as its own keys (``params`` may override)."""
    return {k: getattr(cfg, k) for k in SAMPLING_KEYS if getattr(cfg, k) is not None}


def parse_conductor_spec(spec: str) -> ConductorConfig:
    """Turn ``--conductor SPEC`` into a :class:`ConductorConfig`.

    ``http(s)://HOST/v1[#MODEL]`` is an endpoint; ``prompted:X`` names a pool worker or
    a litellm model; ``local`` is the embedded model; ``hf:ORG/NAME`` or an existing
    directory is a checkpoint.
    """
    spec = spec.strip()
    if _URL.match(spec):
        base, _, model = spec.partition("#")
        return ConductorConfig(
            backend="endpoint", api_base=base.rstrip("/"), model=model or None, client="openai"
        )
    if spec.startswith("prompted:"):
        name = spec.split(":", 1)[1].strip()
        if not name:
            raise UsageError("--conductor prompted: needs a worker id or a model name")
        return ConductorConfig(backend="prompted", model=name, client="litellm")
    if spec == "local":
        return ConductorConfig(backend="local", model="smollm2", client="local", constrained=True)
    if spec.startswith("hf:") or Path(spec).expanduser().is_dir():
        return ConductorConfig(backend="checkpoint", model=spec)
    raise UsageError(
        f"--conductor {spec!r} is not understood: use an http(s)://.../v1 URL (#model "
        "optional), prompted:WORKER_ID or prompted:LITELLM_MODEL, local, hf:ORG/NAME, "
        "or a checkpoint directory"
    )


def _called_target(
    cfg: ConductorConfig, params: dict[str, Any], *, model: str, client: ClientKind
) -> Worker:
    """The Conductor as a model a client calls (a prompted model, an endpoint): the
    config's server, key, price, time-outs, retries and concurrency."""
    return Worker(
        id="conductor",
        model=model,
        client=client,
        api_base=cfg.api_base,
        api_key_env=cfg.api_key_env,
        params=params,
        price=cfg.price,
        timeout_s=cfg.timeout_s,
        total_timeout_s=cfg.total_timeout_s,
        max_retries=cfg.max_retries,
        max_concurrency=cfg.max_concurrency,
        structured_outputs=cfg.structured_outputs or "auto",
    )


def _target_from_config(cfg: ConductorConfig, pool: Pool) -> Worker:
    params = {**_sampling(cfg), **cfg.params}
    if cfg.backend == "prompted":
        if not cfg.model:
            raise UsageError("a prompted conductor needs `model`: a pool worker id or a model")
        ids = {w.id: w for w in pool.workers}
        if cfg.model in ids:
            # The same model, with the Conductor's own sampling settings on top.
            base = ids[cfg.model]
            return replace(
                base,
                id="conductor",
                params={**base.params, **params},
                structured_outputs=cfg.structured_outputs or base.structured_outputs,
            )
        kind: ClientKind = cfg.client if cfg.client != "openai" else "litellm"
        return _called_target(cfg, params, model=cfg.model, client=kind)
    if cfg.backend == "endpoint":
        if not cfg.api_base:
            raise UsageError("an endpoint conductor needs `api_base` (an OpenAI-compatible URL)")
        # Servers such as vLLM serve one model; its name is what the server was given.
        kind = "openai" if cfg.client == "litellm" else cfg.client
        return _called_target(cfg, params, model=cfg.model or "conductor", client=kind)
    if cfg.backend == "local":
        return Worker(
            id="conductor",
            model=cfg.model or "smollm2",
            client="local",
            params=params,
            model_path=cfg.model_path,
            n_ctx=cfg.n_ctx,
            n_threads=cfg.n_threads,
            n_gpu_layers=cfg.n_gpu_layers,
            timeout_s=cfg.timeout_s,
            total_timeout_s=cfg.total_timeout_s,
            max_retries=0,
            max_concurrency=1,
        )
    if cfg.backend == "checkpoint":
        if not cfg.model:
            raise UsageError("a checkpoint conductor needs `model`: a directory or hf:ORG/NAME")
        return Worker(
            id="conductor",
            model=cfg.model,
            client="checkpoint",  # in-process transformers client
            params=params,
            timeout_s=cfg.timeout_s,
            total_timeout_s=cfg.total_timeout_s,
            max_retries=0,
            max_concurrency=1,
        )
    raise UsageError(f"unknown conductor backend {cfg.backend!r}")


def _apply_checkpoint_meta(
    cfg: ConductorConfig,
    pool: Pool,
    template: str | None,
    max_steps: int | None,
    cost_weight: float | None = None,
) -> tuple[ConductorConfig, str | None, int | None]:
    """Honour a checkpoint's ``conductor.json``: the template it was trained with, its
    step limit and sampling settings (where the pool sets none), and a warning for each
    way the user's pool differs from its pool order.  A ``cost_weight`` is refused for a
    checkpoint whose file says it was trained without one (see
    :func:`check_cost_weight_against_meta`)."""
    from ..llm.checkpoint_load import resolve_checkpoint_dir
    from .checkpoint import (
        check_cost_weight_against_meta,
        check_pool_against_meta,
        read_checkpoint_meta,
        template_ref,
    )

    assert cfg.model is not None
    directory = resolve_checkpoint_dir(cfg.model)
    cfg = replace(cfg, model=str(directory))
    meta = read_checkpoint_meta(directory)
    if cost_weight is not None:
        for problem in check_cost_weight_against_meta(cost_weight, meta):
            log.warning("checkpoint %s: %s", directory, problem)
    if meta is None:
        return cfg, template, max_steps
    if template is None and cfg.template == "default":
        template = template_ref(directory, meta)
    if max_steps is None and meta.max_steps:
        max_steps = meta.max_steps
    unset = {
        k: v
        for k, v in meta.sampling.items()
        if k in SAMPLING_KEYS and getattr(cfg, k) is None and k not in cfg.params
    }
    if unset:
        cfg = replace(cfg, **unset)
    for problem in check_pool_against_meta([w.id for w in pool.workers], meta):
        log.warning("checkpoint %s: %s", directory, problem)
    return cfg, template, max_steps


def resolve_conductor(
    pool: Pool,
    spec: str | None = None,
    *,
    max_steps: int | None = None,
    template: str | None = None,
    cost_weight: float | None = None,
) -> Conductor:
    """The Conductor for a run: ``spec`` if given, else the pool's own ``conductor:``.

    ``cost_weight`` (``--cost-weight``) states the weight in the Conductor's prompt, for
    a checkpoint trained cost-conditioned (``reward.cost_weights``); a checkpoint whose
    ``conductor.json`` says it was not is refused, since the line would be words it
    never learnt from, not a point on a front.  Other backends cannot say how they
    were trained and get the line as it is.
    """
    if cost_weight is not None:
        from .prompt import check_cost_weight

        cost_weight = check_cost_weight(cost_weight)
    if spec is not None:
        cfg = parse_conductor_spec(spec)
        if pool.conductor is not None and pool.conductor.backend == cfg.backend:
            # Keep the pool's prompt settings (template, descriptions, ...) for the
            # same kind of backend; the spec only says which model.
            cfg = replace(
                pool.conductor,
                model=cfg.model or pool.conductor.model,
                api_base=cfg.api_base or pool.conductor.api_base,
            )
    elif pool.conductor is not None:
        cfg = pool.conductor
    else:
        raise UsageError(
            f"pool {pool.name!r} has no `conductor:` section; pass --conductor "
            "(e.g. --conductor prompted:WORKER_ID or --conductor http://HOST:PORT/v1)"
        )
    if cfg.backend == "checkpoint":
        cfg, template, max_steps = _apply_checkpoint_meta(
            cfg, pool, template, max_steps, cost_weight
        )
    target = _target_from_config(cfg, pool)
    conductor = Conductor(
        backend=cfg.backend,
        target=target,
        template=template or cfg.template,
        max_steps=max_steps if max_steps is not None else cfg.max_steps,
        parse_retries=cfg.parse_retries,
        show_descriptions=cfg.show_descriptions,
        constrained=cfg.constrained,
        max_reasoning_chars=cfg.max_reasoning_chars,
        min_subtask_chars=cfg.min_subtask_chars,
        max_subtask_chars=cfg.max_subtask_chars,
        subtasks=cfg.subtasks,
        cost_weight=cost_weight,
    )
    conductor.check_prefill()
    return conductor
