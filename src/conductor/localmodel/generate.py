"""One chat completion on a loaded model: the prompt, the prompt cache, the loop (and
the pooled hidden states of plain texts, for a router's features).

Runs in a model's host process (:mod:`conductor.localmodel.host`) on any runtime's
:class:`~conductor.localmodel.runtime.NativeModel`, so every runtime renders, caches,
samples and stops the same way.

- **The prompt** is the GGUF file's own chat template (``tokenizer.chat_template``, a
  Jinja template as in Hugging Face tokenizers), rendered in jinja2's immutable sandbox:
  the template is the file author's code and may be hostile.  A file without one gets
  ChatML.
- **The prompt cache**: the tokens already evaluated stay in the model's memory (and
  the last few prompts in saved copies of it), and a new prompt evaluates only what
  follows their common prefix.  A Conductor sends the same long preamble for every
  question, so only the question is evaluated again.
- **The loop** evaluates the prompt in short pieces and generates one token at a time,
  asking ``cancelled()`` before each, so a cancelled call ends within one piece.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .runtime import EMBED_TOKENS, NativeModel, SamplerSettings, sampler_links

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "ContextOverflow",
    "Embeddings",
    "Generation",
    "GenerationCancelled",
    "Generator",
    "TemplateError",
    "clip_tokens",
]

#: The template of a GGUF file that has none.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Prompt tokens evaluated between two looks at the cancel flag.
PROMPT_PIECE = 64
# Tokens of generated text looked at again for a stop string (a stop string spans at
# most this many of them).
_STOP_WINDOW = 32


class GenerationCancelled(Exception):
    """The call was cancelled while it ran."""


class ContextOverflow(ValueError):
    """The prompt does not fit in the model's context window."""


class TemplateError(ValueError):
    """The model's chat template failed to render the conversation."""


@dataclass(frozen=True)
class Generation:
    """What one completion produced."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" or "length"
    cached_tokens: int  # prompt tokens the prompt cache saved
    prompt_s: float
    generate_s: float


@dataclass(frozen=True)
class Embeddings:
    """Texts' pooled hidden states (:meth:`Generator.embed`)."""

    vectors: list[list[float]]
    #: The tokens each text was read as (at most :data:`EMBED_TOKENS`).
    tokens: list[int]
    embed_s: float


def clip_tokens(tokens: list[int], limit: int = EMBED_TOKENS) -> list[int]:
    """``tokens``, or their first and last halves of ``limit`` when there are more: what
    kind of text it is shows at its start and at its end."""
    if len(tokens) <= limit:
        return tokens
    head = limit // 2
    return tokens[:head] + tokens[len(tokens) - (limit - head) :]


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


@functools.cache
def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    return env


class ChatTemplate:
    """A model's chat template, compiled once."""

    def __init__(self, source: str | None, *, bos: str, eos: str) -> None:
        self.source = source or CHATML_TEMPLATE
        self.bos = bos
        self.eos = eos
        from jinja2 import TemplateError as JinjaError

        try:
            self._template = _environment().from_string(self.source)
        except JinjaError as exc:
            raise TemplateError(f"the model's chat template does not compile: {exc}") from exc

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        from jinja2 import TemplateError as JinjaError

        try:
            return str(
                self._template.render(
                    messages=list(messages),
                    add_generation_prompt=True,
                    bos_token=self.bos,
                    eos_token=self.eos,
                )
            )
        except TemplateError:
            raise
        except (JinjaError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Slots:
    """The prompt cache: the prompts the model's memory held lately.

    The memory holds one of them (``live``); the others are saved copies of it
    (:meth:`NativeModel.save`) that come back when a prompt starting like one of them
    does.  A new prompt goes to the slot that holds the longest start of it, unless
    using that slot would throw away more of what it holds than it saves (a short call
    that shares only the chat template's opening with the Conductor's long preamble),
    so the preamble and each worker's system prompt keep a slot each while other calls
    come and go.  With no such slot, the one used longest ago is taken.

    Why copies and not several sequences of one memory: llama.cpp puts a sequence's
    positions in whichever cells are free, and the same prompt's logits differ with
    where it lies (by up to 0.59 on SmolLM2, measured), so a seeded sample would
    depend on what else the cache held.  A restored copy lies where a fresh
    evaluation would, and replies match a fresh model's bit for bit.
    """

    def __init__(self, count: int) -> None:
        self.held: list[list[int]] = [[] for _ in range(max(1, count))]
        self.saved: list[bytes | None] = [None] * len(self.held)
        self.live = 0
        self._used = [0] * len(self.held)
        self._clock = 0

    def choose(self, tokens: list[int]) -> tuple[int, int]:
        """The slot for ``tokens`` and how many of its tokens it holds already."""
        shared = [_common_prefix(held, tokens) for held in self.held]
        worth = [i for i, held in enumerate(self.held) if shared[i] >= len(held) - shared[i]]
        if worth:
            best = max(worth, key=lambda i: (shared[i], -len(self.held[i]), -self._used[i]))
        else:
            best = min(range(len(self.held)), key=lambda i: self._used[i])
        self._clock += 1
        self._used[best] = self._clock
        return best, shared[best]

    def drop(self, slot: int) -> None:
        self.held[slot].clear()
        self.saved[slot] = None

    def trim(self, limit: int) -> None:
        """Drop saved copies, the one used longest ago first, until they hold at most
        ``limit`` positions together (as much as the memory itself)."""
        for slot in sorted(range(len(self.held)), key=self._used.__getitem__):
            if sum(len(self.held[i]) for i in range(len(self.held)) if i != self.live) <= limit:
                return
            if slot != self.live:
                self.drop(slot)


class Generator:
    """Chat completions on one model, one at a time, with a prompt cache of up to
    ``cached`` prompts (:class:`_Slots`)."""

    def __init__(self, model: NativeModel, *, cached: int = 1) -> None:
        self.model = model
        bos = model.token_text(model.bos_token) if model.bos_token >= 0 else ""
        eos = model.token_text(model.eos_token) if model.eos_token >= 0 else ""
        self.template = ChatTemplate(model.metadata("tokenizer.chat_template"), bos=bos, eos=eos)
        self._bos = model.bos_token
        self._slots = _Slots(cached)

    @property
    def _evaluated(self) -> list[int]:
        """What the model's memory holds, position by position."""
        return self._slots.held[self._slots.live]

    def forget(self) -> None:
        """Empty the prompt cache (the model's memory and the saved copies)."""
        self.model.clear()
        for slot in range(len(self._slots.held)):
            self._slots.drop(slot)

    def prompt_tokens(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The tokens of ``messages`` in the model's chat format."""
        tokens = self.model.tokenize(self.template.render(messages), add_special=True)
        # A template that writes the BOS token itself, tokenized with the BOS the
        # tokenizer adds, would start with two.
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self._bos:
            tokens = tokens[1:]
        return tokens

    def _switch(self, slot: int) -> None:
        """Save what the memory holds and bring ``slot``'s copy back into it."""
        slots = self._slots
        if self._evaluated:
            slots.saved[slots.live] = self.model.save()
        self.model.clear()
        slots.live = slot
        state, slots.saved[slot] = slots.saved[slot], None
        if slots.held[slot] and (state is None or not self.model.restore(state)):
            slots.held[slot].clear()
        slots.trim(self.model.n_ctx)

    def _evaluate_prompt(self, tokens: list[int], cancelled: Callable[[], bool]) -> int:
        """Bring the model's memory to ``tokens``; returns how many were reused from
        the cache."""
        slot, _ = self._slots.choose(tokens)
        if slot != self._slots.live:
            self._switch(slot)
        # At least the last token is evaluated again: its logits start the reply.
        reuse = min(_common_prefix(self._evaluated, tokens), len(tokens) - 1)
        if not self.model.keep(reuse):
            self.model.clear()
            reuse = 0
        del self._evaluated[reuse:]
        for start in range(reuse, len(tokens), PROMPT_PIECE):
            if cancelled():
                raise GenerationCancelled(
                    f"cancelled while reading the prompt ({start} of {len(tokens)} tokens)"
                )
            self._evaluate(tokens[start : start + PROMPT_PIECE], start)
        return reuse

    def _evaluate(self, tokens: list[int], pos: int) -> None:
        """Evaluate ``tokens`` at ``pos``; if that fails, what the memory holds is
        unknown, so it is emptied."""
        try:
            self.model.evaluate(tokens, pos)
        except BaseException:
            self._evaluated.clear()
            self.model.clear()
            raise
        self._evaluated.extend(tokens)

    def generate(
        self,
        messages: Sequence[dict[str, str]],
        settings: SamplerSettings,
        *,
        max_tokens: int | None = None,
        grammar: str | None = None,
        stop: Sequence[str] = (),
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Generation:
        """One completion of ``messages``.

        Raises :class:`ContextOverflow` when the prompt leaves no room to answer,
        :class:`GenerationCancelled` once ``cancelled()`` says so, and the runtime's
        :class:`~conductor.localmodel.runtime.GrammarError` for a grammar it cannot
        parse (before anything is evaluated).
        """
        model = self.model
        tokens = self.prompt_tokens(messages)
        n_ctx = model.n_ctx
        if len(tokens) >= n_ctx:
            raise ContextOverflow(
                f"the prompt has {len(tokens)} tokens and the context window "
                f"{n_ctx}: no room is left for a reply"
            )
        room = n_ctx - len(tokens)
        budget = room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)
        sampler = model.sampler(sampler_links(settings, grammar))
        try:
            started = time.perf_counter()
            reused = self._evaluate_prompt(tokens, cancelled)
            prompt_done = time.perf_counter()
            out, finish = self._loop(sampler, budget, stop, cancelled)
        finally:
            sampler.close()
        text = model.detokenize(out)
        cut = _cut_at_stop(text, stop) if stop else None
        if cut is not None:
            text = cut
        return Generation(
            text=text,
            prompt_tokens=len(tokens),
            completion_tokens=len(out),
            finish_reason=finish,
            cached_tokens=reused,
            prompt_s=prompt_done - started,
            generate_s=time.perf_counter() - prompt_done,
        )

    def embed(
        self, texts: Sequence[str], *, cancelled: Callable[[], bool] = lambda: False
    ) -> Embeddings:
        """Each text's hidden states pooled (:meth:`NativeModel.embed`), read as it is,
        without the chat template; raises :class:`GenerationCancelled` between texts
        once ``cancelled()`` says so."""
        model = self.model
        started = time.perf_counter()
        vectors: list[list[float]] = []
        counts: list[int] = []
        for done, text in enumerate(texts):
            if cancelled():
                raise GenerationCancelled(f"cancelled after {done} of {len(texts)} texts")
            if not isinstance(text, str):
                raise TypeError(f"text {done} is {type(text).__name__}, not a string")
            tokens = clip_tokens(model.tokenize(text, add_special=True))
            if not tokens:  # an empty text, from a tokenizer that adds nothing
                tokens = [model.bos_token if model.bos_token >= 0 else model.eos_token]
            vectors.append(model.embed(tokens))
            counts.append(len(tokens))
        return Embeddings(vectors, counts, time.perf_counter() - started)

    def _loop(
        self,
        sampler: Any,
        budget: int,
        stop: Sequence[str],
        cancelled: Callable[[], bool],
    ) -> tuple[list[int], str]:
        model = self.model
        out: list[int] = []
        while len(out) < budget:
            if cancelled():
                raise GenerationCancelled(f"cancelled after {len(out)} generated tokens")
            token = sampler.sample()
            if model.is_end_of_generation(token):
                return out, "stop"
            out.append(token)
            if stop and _cut_at_stop(model.detokenize(out[-_STOP_WINDOW:]), stop) is not None:
                return out, "stop"
            if len(out) == budget:
                break
            self._evaluate([token], len(self._evaluated))
        return out, "length"


def _cut_at_stop(text: str, stop: Sequence[str]) -> str | None:
    """``text`` up to the first stop string in it, or None when there is none."""
    cuts = [i for s in stop if s and (i := text.find(s)) >= 0]
    return text[: min(cuts)] if cuts else None
