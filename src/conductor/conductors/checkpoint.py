"""Where a trained Conductor checkpoint lives, and the ``conductor.json`` it may carry.

A trained Conductor is tied to the prompt template and the pool order it was trained
with (it picks workers by position, "Model 0", "Model 1", ...).  A checkpoint directory
records both in an optional ``conductor.json`` beside the model files::

    {
      "format_version": 1,
      "template": "prompt.txt",
      "pool_order": ["gemini-2.5-pro", "claude-sonnet-4", "gpt-5"],
      "max_steps": 5,
      "base_model": "Qwen/Qwen2.5-7B-Instruct",
      "allow_indices": false
    }

Fields (all but ``format_version`` optional):

- ``format_version`` (int, required): ``1``; any other value is refused, so an older
  conductor never misreads a newer file.
- ``template`` (str or object): the file name of the prompt template, relative to the
  checkpoint directory (it must stay inside it; ``.txt`` is the text form, ``.yaml`` the
  chat form), or the template itself in chat form, inline: an object with ``user`` and
  optionally ``system``, ``prefill`` and ``revise`` (``{"user": ..., "prefill": ...}``).
  Or ``template_text`` (str): a text-form template, inline.  At most one of the two.
  Placeholders and forms as in :mod:`conductor.conductors.prompt`.
- ``sampling`` (object): the Conductor's sampling settings, ``temperature`` (>= 0),
  ``max_tokens`` (>= 1) and ``top_p`` (0 to 1), each optional; used where the pool's
  ``conductor:`` section sets none.
- ``pool_order`` (list of str): the worker ids, in the order the checkpoint was trained
  on.  A run whose pool differs gets warnings from :func:`check_pool_against_meta`.
- ``max_steps`` (int >= 1): the step limit used in training.
- ``base_model`` (str): the model it was fine-tuned from (informational).
- ``allow_indices`` (bool, default false): whether it was trained with explicit step
  indices in access lists (``[0, 2]``) rather than only ``[]`` / ``["all"]``.
- ``cost_weights`` (list of numbers >= 0): the checkpoint was trained cost-conditioned
  (``reward.cost_weights``): each question's prompt stated one of these weights per
  US dollar, and its reward subtracted that weight times the USD spent.  Only such a
  checkpoint takes ``--cost-weight``; see :func:`check_cost_weight_against_meta`.
- ``training_questions`` (str): the file, inside the checkpoint directory, holding the
  hashes of the questions it was trained on (written by ``conductor train``; see
  :func:`write_training_questions`), which ``conductor bench`` counts or excludes; the
  same file keeps what the held-out guard compared them with (``guard``: the sets
  checked, those left unchecked with ``accept_unchecked_holdout``, the n-gram settings).

Unknown keys are kept in :attr:`CheckpointMeta.extra` and otherwise ignored, so a later
training run may add fields without breaking older readers.

``--conductor`` names a checkpoint as a local directory or as ``hf:ORG/NAME[@REVISION]``;
:func:`~conductor.llm.checkpoint_load.resolve_checkpoint_dir` turns
either into a local directory (downloading, or reading Hugging Face's local cache when
``HF_HUB_OFFLINE=1``): the model-call layer loads checkpoints without this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..errors import UsageError
from ..private import make_private_dir, write_private
from ..text import plural
from ..userfiles import (
    MAX_CONFIG_BYTES,
    UnreadableFileError,
    is_regular,
    parse_json,
    read_regular,
    resolved,
    utf8_text,
)

__all__ = [
    "META_FILE",
    "SUPPORTED_FORMAT_VERSIONS",
    "TEXT_TEMPLATE_FILE",
    "CheckpointMeta",
    "check_cost_weight_against_meta",
    "check_pool_against_meta",
    "TRAINING_QUESTIONS_FILE",
    "read_checkpoint_meta",
    "read_training_guard",
    "read_training_questions",
    "stored_template",
    "template_ref",
    "write_checkpoint_meta",
    "write_training_questions",
]

#: The metadata file's name inside a checkpoint directory.
META_FILE = "conductor.json"
#: The file a text-form training template is stored as inside a checkpoint.
TEXT_TEMPLATE_FILE = "prompt.txt"
#: ``format_version`` values this version of conductor reads.
SUPPORTED_FORMAT_VERSIONS: tuple[int, ...] = (1,)

_KNOWN_KEYS = (
    "format_version",
    "template",
    "template_text",
    "pool_order",
    "max_steps",
    "base_model",
    "allow_indices",
    "sampling",
    "cost_weights",
)


@dataclass(frozen=True)
class CheckpointMeta:
    """The contents of a checkpoint's ``conductor.json`` (see the module docstring)."""

    format_version: int = 1
    template: str | None = None
    template_text: str | None = None
    #: An inline chat-form template (``template`` as an object), as written in the file.
    template_chat: dict[str, Any] | None = None
    #: ``temperature`` / ``max_tokens`` / ``top_p``, as far as the file sets them.
    sampling: dict[str, Any] = field(default_factory=dict)
    pool_order: tuple[str, ...] | None = None
    max_steps: int | None = None
    base_model: str | None = None
    allow_indices: bool = False
    #: The cost weights it was trained on (None: not cost-conditioned).
    cost_weights: tuple[float, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, without unset optional fields; unknown keys are written back."""
        out: dict[str, Any] = {"format_version": self.format_version}
        if self.template is not None:
            out["template"] = self.template
        if self.template_chat is not None:
            out["template"] = dict(self.template_chat)
        if self.template_text is not None:
            out["template_text"] = self.template_text
        if self.pool_order is not None:
            out["pool_order"] = list(self.pool_order)
        if self.max_steps is not None:
            out["max_steps"] = self.max_steps
        if self.base_model is not None:
            out["base_model"] = self.base_model
        out["allow_indices"] = self.allow_indices
        if self.sampling:
            out["sampling"] = dict(self.sampling)
        if self.cost_weights is not None:
            out["cost_weights"] = list(self.cost_weights)
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


def _bad(path: Path, key: str, reason: str) -> UsageError:
    return UsageError(f"{path}: field {key!r}: {reason}")


def _meta_file(path: Path) -> Path:
    path = Path(path).expanduser()
    return path / META_FILE if path.is_dir() else path


def read_checkpoint_meta(path: Path) -> CheckpointMeta | None:
    """Read ``conductor.json`` from checkpoint directory ``path`` (or the file itself).

    Returns ``None`` when there is no such file.  A file that is not a JSON object,
    has an unsupported ``format_version`` or a field of the wrong type raises
    :class:`~conductor.errors.UsageError` naming the file and the field.  A ``template``
    must name an existing file inside the checkpoint directory.
    """
    file = _meta_file(Path(path))
    if not os.path.lexists(file):
        return None
    # What is there is read only when it is a regular file (a FIFO would wait); every
    # way it fails is an UnreadableFileError, a UsageError naming the file.
    text = utf8_text(read_regular(file, "conductor.json", MAX_CONFIG_BYTES), file, "file")
    data = parse_json(text, file)
    if not isinstance(data, dict):
        raise UsageError(f"{file}: expected a JSON object, got {type(data).__name__}")

    if "format_version" not in data:
        raise _bad(file, "format_version", "missing (expected 1)")
    version = data["format_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise _bad(file, "format_version", f"expected an integer, got {version!r}")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_FORMAT_VERSIONS)
        raise _bad(
            file,
            "format_version",
            f"version {version} is not supported by this conductor (supported: {supported}); "
            "upgrade conductor",
        )

    def opt_str(key: str) -> str | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise _bad(file, key, f"expected a non-empty string, got {value!r}")
        return value

    template_chat: dict[str, Any] | None = None
    if isinstance(data.get("template"), dict):
        template_chat = data["template"]
        _check_inline_chat(file, template_chat)
        template = None
    else:
        template = opt_str("template")
    template_text = opt_str("template_text")
    base_model = opt_str("base_model")
    if (template is not None or template_chat is not None) and template_text is not None:
        raise _bad(file, "template", "set either 'template' or 'template_text', not both")
    if template is not None:
        root = resolved(file.parent)
        target = resolved(root / template)
        if os.path.isabs(template) or root not in target.parents:
            raise _bad(file, "template", f"{template!r} must be a file name inside {file.parent}")
        if not is_regular(target):
            raise _bad(file, "template", f"template file {template!r} not found in {root}")

    pool_order: tuple[str, ...] | None = None
    raw_order = data.get("pool_order")
    if raw_order is not None:
        if not isinstance(raw_order, list) or not all(
            isinstance(x, str) and x.strip() for x in raw_order
        ):
            raise _bad(file, "pool_order", "expected a list of worker ids (strings)")
        dupes = sorted({x for x in raw_order if raw_order.count(x) > 1})
        if dupes:
            raise _bad(file, "pool_order", f"repeated worker ids: {', '.join(dupes)}")
        pool_order = tuple(raw_order)

    max_steps = data.get("max_steps")
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
    ):
        raise _bad(file, "max_steps", f"expected a positive integer, got {max_steps!r}")

    allow_indices = data.get("allow_indices", False)
    if allow_indices is None:
        allow_indices = False
    if not isinstance(allow_indices, bool):
        raise _bad(file, "allow_indices", f"expected true or false, got {allow_indices!r}")

    cost_weights: tuple[float, ...] | None = None
    raw_weights = data.get("cost_weights")
    if raw_weights is not None:
        if (
            not isinstance(raw_weights, list)
            or not raw_weights
            or not all(
                isinstance(w, int | float) and not isinstance(w, bool) and 0 <= w < float("inf")
                for w in raw_weights
            )
        ):
            raise _bad(file, "cost_weights", "expected a non-empty list of numbers >= 0")
        cost_weights = tuple(float(w) for w in raw_weights)

    return CheckpointMeta(
        format_version=version,
        template=template,
        template_text=template_text,
        template_chat=template_chat,
        sampling=_read_sampling(file, data.get("sampling")),
        pool_order=pool_order,
        max_steps=max_steps,
        base_model=base_model,
        allow_indices=allow_indices,
        cost_weights=cost_weights,
        extra={k: v for k, v in data.items() if k not in _KNOWN_KEYS},
    )


def _check_inline_chat(file: Path, data: dict[str, Any]) -> None:
    """Check an inline chat-form ``template`` the way a template file is checked."""
    from .prompt import chat_template_from_dict

    def fail(field_name: str, message: str, offset: int | None) -> NoReturn:
        where = f"template.{field_name}" if field_name else "template"
        raise _bad(file, where, message)

    chat_template_from_dict(data, fail)


def _read_sampling(file: Path, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(file, "sampling", "expected an object with temperature, max_tokens, top_p")
    out: dict[str, Any] = {}
    for key, number in value.items():
        where = f"sampling.{key}"
        if key not in ("temperature", "max_tokens", "top_p"):
            raise _bad(file, where, "unknown setting (known: temperature, max_tokens, top_p)")
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise _bad(file, where, f"expected a number, got {number!r}")
        if key == "max_tokens" and (not isinstance(number, int) or number < 1):
            raise _bad(file, where, f"expected a positive integer, got {number!r}")
        if key == "temperature" and not number >= 0:
            raise _bad(file, where, f"expected a number >= 0, got {number!r}")
        if key == "top_p" and not 0 < number <= 1:
            raise _bad(file, where, f"expected a number in (0, 1], got {number!r}")
        out[key] = number
    return out


def stored_template(directory: Path, name_or_path: str) -> dict[str, Any]:
    """Store template ``name_or_path`` in checkpoint ``directory`` in the form it has, and
    return the :class:`CheckpointMeta` fields that name it: a chat template inline
    (``template_chat``), a text template as :data:`TEXT_TEMPLATE_FILE` written beside the
    model (``template``)."""
    from .prompt import load_conductor_template

    loaded = load_conductor_template(name_or_path)
    if loaded.chat is not None:
        return {"template_chat": loaded.chat.to_dict()}
    write_private(Path(directory) / TEXT_TEMPLATE_FILE, loaded.text, atomic=False)
    return {"template": TEXT_TEMPLATE_FILE}


def write_checkpoint_meta(path: Path, meta: CheckpointMeta) -> Path:
    """Write ``meta`` as ``conductor.json`` into directory ``path``; return the file."""
    directory = Path(path).expanduser()
    make_private_dir(directory)
    file = directory / META_FILE
    # Write-then-rename, so a crash never leaves a half-written file for readers.
    write_private(file, json.dumps(meta.to_dict(), indent=2, ensure_ascii=False) + "\n")
    return file


def check_cost_weight_against_meta(weight: float, meta: CheckpointMeta | None) -> list[str]:
    """Warnings (one sentence each) for running a checkpoint at cost ``weight``.

    Raises :class:`UsageError` when ``meta`` says the checkpoint was trained without
    cost weights: the line would be words it never learnt from, and its answers would
    not move along a front (refused, not warned, because the run would look like a
    point on a trade-off it cannot make).  Without a ``conductor.json`` nothing is known,
    so that is a warning, as is a weight outside the trained ones (an extrapolation).
    """
    if meta is None:
        return [
            "it has no conductor.json, so whether it was trained cost-conditioned "
            "(reward.cost_weights) is unknown; --cost-weight only adds its line to the prompt"
        ]
    if meta.cost_weights is None:
        raise UsageError(
            f"--cost-weight {weight:g}: this checkpoint was trained without cost weights "
            "(its conductor.json has no cost_weights), so the weight would be words it "
            "never learnt from; leave --cost-weight out, or train with reward.cost_weights"
        )
    low, high = min(meta.cost_weights), max(meta.cost_weights)
    if not low <= weight <= high:
        return [
            f"--cost-weight {weight:g} lies outside the weights it was trained on "
            f"({low:g} to {high:g}): an extrapolation"
        ]
    return []


def check_pool_against_meta(pool_worker_ids: Sequence[str], meta: CheckpointMeta) -> list[str]:
    """Warnings (one sentence each) where the run's pool differs from the training pool.

    Empty when ``meta`` records no ``pool_order`` or the pool matches it exactly.  The
    caller logs them; a mismatch is allowed (a Conductor trained on random sub-pools may
    cope) but the user should know that "Model i" now means another worker.
    """
    if meta.pool_order is None:
        return []
    trained = list(meta.pool_order)
    pool = list(pool_worker_ids)
    if pool == trained:
        return []
    warnings: list[str] = []
    if len(pool) != len(trained):
        warnings.append(
            f"the pool has {plural(len(pool), 'worker')} but the checkpoint was trained on "
            f"{len(trained)} ({', '.join(trained)})"
        )
    unknown = [w for w in pool if w not in trained]
    if unknown:
        warnings.append(f"workers not in the checkpoint's training pool: {', '.join(unknown)}")
    missing = [w for w in trained if w not in pool]
    if missing:
        warnings.append(f"training-pool workers missing from this pool: {', '.join(missing)}")
    moved = [
        f"Model {i} is {p!r} here but was {t!r} in training"
        for i, (p, t) in enumerate(zip(pool, trained, strict=False))
        if p != t
    ]
    if moved:
        warnings.append(
            "the pool order differs from the checkpoint's training order "
            "(the Conductor picks workers by position): " + "; ".join(moved)
        )
    return warnings


def template_ref(checkpoint_dir: Path, meta: CheckpointMeta | None) -> str | None:
    """What to pass as the Conductor's ``template`` for this checkpoint, or ``None``.

    ``template`` gives the absolute path of the file in the checkpoint directory.
    ``template_text`` (or an inline chat-form ``template``) is written once to a ``.txt``
    (``.yaml``) file named by its hash under conductor's cache directory (checkpoint
    directories, e.g. Hugging Face's cache, may be read-only) and that path is
    returned, since templates are loaded by path.
    """
    if meta is None:
        return None
    if meta.template is not None:
        return str(resolved(Path(checkpoint_dir).expanduser() / meta.template))
    if meta.template_text is not None:
        return _cached_template(meta.template_text, ".txt")
    if meta.template_chat is not None:
        # JSON is YAML: the object, written as JSON, is a chat template file as it stands.
        text = json.dumps(meta.template_chat, indent=2, ensure_ascii=False) + "\n"
        return _cached_template(text, ".yaml")
    return None


def _cached_template(text: str, suffix: str) -> str:
    """The path of a file holding ``text`` under conductor's cache directory (named by
    its hash, written once)."""
    from ..private import default_cache_dir

    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    folder = default_cache_dir().parent / "templates"
    make_private_dir(folder)
    file = folder / f"checkpoint-{digest}{suffix}"
    if not file.is_file():
        tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        write_private(tmp, text, atomic=False)
        os.replace(tmp, file)
    return str(file)


# -- the questions a checkpoint was trained on ---------------------------------------------

#: The side file with the training questions' hashes, referenced from ``conductor.json``.
TRAINING_QUESTIONS_FILE = "training_questions.json"
_TRAINING_KEY = "training_questions"
#: The most a training-questions file is read up to (a key per question trained on).
_MAX_TRAINED_BYTES = 256 << 20
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def write_training_questions(
    directory: Path,
    hashes: Sequence[str] | frozenset[str],
    *,
    normalisation: str,
    guard: Mapping[str, Any] | None = None,
) -> Path:
    """Record the hashes of the questions a checkpoint was trained on.

    Writes ``training_questions.json`` (``{"format_version": 1, "normalisation": ...,
    "count": N, "sha256": [...]}``, hashes sorted, and ``"guard": {...}`` when given)
    into checkpoint ``directory`` and names it under ``training_questions`` in its
    ``conductor.json``, which must exist.  ``normalisation`` names how the questions
    were normalised before hashing (:data:`conductor.datasets.questions.NORMALISATION`);
    ``guard`` is what the held-out check compared
    (:meth:`conductor.train.contamination.GuardResult.record`).
    """
    import dataclasses

    directory = Path(directory).expanduser()
    meta = read_checkpoint_meta(directory)
    if meta is None:
        raise UsageError(f"{directory}: no {META_FILE} to record the training questions in")
    values = sorted(set(hashes))
    bad = next((h for h in values if not _SHA256_HEX.match(h)), None)
    if bad is not None:
        raise ValueError(f"not a SHA-256 hex digest: {bad!r}")
    data = {
        "format_version": 1,
        "normalisation": normalisation,
        "count": len(values),
        "sha256": values,
    }
    if guard is not None:
        data["guard"] = dict(guard)
    file = directory / TRAINING_QUESTIONS_FILE
    write_private(file, json.dumps(data, indent=0) + "\n")
    extra = {**meta.extra, _TRAINING_KEY: TRAINING_QUESTIONS_FILE}
    write_checkpoint_meta(directory, dataclasses.replace(meta, extra=extra))
    return file


def _training_file(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The training-questions file a checkpoint names and its checked top level."""
    meta_file = _meta_file(Path(directory))
    meta = read_checkpoint_meta(meta_file)
    if meta is None or meta.extra.get(_TRAINING_KEY) is None:
        return None
    name = meta.extra[_TRAINING_KEY]
    root = resolved(meta_file.parent)
    if (
        not isinstance(name, str)
        or os.path.isabs(name)
        or root not in resolved(root / name).parents
    ):
        raise _bad(meta_file, _TRAINING_KEY, f"{name!r} must be a file name inside {root}")
    file = root / name
    if not os.path.lexists(file):
        raise _bad(meta_file, _TRAINING_KEY, f"{name!r} not found in {root}")
    try:
        raw = read_regular(file, "training-questions file", _MAX_TRAINED_BYTES)
        data = parse_json(utf8_text(raw, file, "training-questions file"), file)
    except UnreadableFileError as exc:
        raise UsageError(f"{exc} (not a training-questions file)") from None
    if not isinstance(data, dict) or data.get("format_version") != 1:
        raise UsageError(f"{file}: not a training-questions file of format_version 1")
    return file, data


def read_training_questions(directory: Path) -> tuple[str, frozenset[str]] | None:
    """The normalisation name and the training-question hashes a checkpoint records.

    ``None`` when the checkpoint has no ``conductor.json`` or it names no
    ``training_questions`` file.  A named file that is missing, outside the checkpoint
    directory or malformed raises :class:`~conductor.errors.UsageError` naming it.
    """
    found = _training_file(directory)
    if found is None:
        return None
    file, data = found
    normalisation = data.get("normalisation")
    hashes = data.get("sha256")
    if not isinstance(normalisation, str) or not isinstance(hashes, list):
        raise UsageError(f"{file}: expected 'normalisation' (a string) and 'sha256' (a list)")
    bad = next((h for h in hashes if not isinstance(h, str) or not _SHA256_HEX.match(h)), None)
    if bad is not None:
        raise UsageError(f"{file}: {bad!r} in 'sha256' is not a SHA-256 hex digest")
    return normalisation, frozenset(hashes)


def read_training_guard(directory: Path) -> dict[str, Any] | None:
    """What the held-out guard compared a checkpoint's training questions with (the
    ``guard`` of its training-questions file), or ``None`` when it records nothing
    (no file, or one written before the guard was recorded)."""
    found = _training_file(directory)
    if found is None:
        return None
    file, data = found
    guard = data.get("guard")
    if guard is None:
        return None
    if not isinstance(guard, dict):
        raise UsageError(f"{file}: 'guard' must be an object")
    return guard
