"""The ``cyllama`` runtime: llama.cpp through cyllama's binary wheels.

Only cyllama's llama.h-shaped classes are used (``LlamaModel``, ``LlamaContext``,
``LlamaSampler``, ``LlamaVocab``), the part that follows llama.cpp's C API and that
cyllama 0.2 and 0.7 share.  Imported only inside a model's host process.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from .runtime import (
    EMBED_TOKENS,
    GrammarError,
    LoadSettings,
    LogCatcher,
    NativeModel,
    NativeSampler,
    Runtime,
    RuntimeInfo,
    SamplerLink,
    check_embeddable,
    embedding_context_params,
    mean_rows,
)

__all__ = ["runtime"]


class _Sampler:
    def __init__(self, chain: Any, ctx: Any) -> None:
        self._chain = chain
        self._ctx = ctx

    def sample(self) -> int:
        return int(self._chain.sample(self._ctx, -1))

    def close(self) -> None:
        self._chain.close()


class _Model:
    def __init__(self, cy: Any, log: LogCatcher, settings: LoadSettings) -> None:
        self._cy = cy
        self._log = log
        self._settings = settings
        # The embedding context and its batch, made on the first embed().
        self._embedder: tuple[Any, Any] | None = None
        params = cy.LlamaModelParams()
        params.n_gpu_layers = settings.n_gpu_layers
        params.use_extra_bufts = settings.extra_buffers
        log.take()
        try:
            self._model = cy.LlamaModel(settings.path, params)
        except Exception as exc:  # cyllama raises ValueError or RuntimeError here
            detail = "; ".join(log.take()) or str(exc)
            raise ValueError(detail) from exc
        self._vocab = self._model.get_vocab()
        ctx_params = cy.LlamaContextParams()
        ctx_params.n_ctx = settings.n_ctx
        ctx_params.n_batch = settings.n_batch
        ctx_params.n_threads = settings.n_threads
        ctx_params.n_threads_batch = settings.n_threads
        ctx_params.flash_attn_type = settings.flash_attention_type
        ctx_params.n_seq_max = 1
        try:
            self._ctx = cy.LlamaContext(self._model, ctx_params)
        except Exception as exc:
            detail = "; ".join(log.take()) or str(exc)
            raise ValueError(
                f"cannot create a context of {settings.n_ctx} tokens: {detail}"
            ) from exc
        self._n_ctx = int(self._ctx.n_ctx)
        self._n_vocab = int(self._vocab.n_vocab)
        self._n_batch = settings.n_batch
        self._batch = cy.LlamaBatch(n_tokens=settings.n_batch, embd=0, n_seq_max=1)
        first = list(self._vocab.tokenize("x", add_special=False, parse_special=False))[:1] or [0]
        self._sentinel = (first[0], str(self._vocab.detokenize(first)))

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def metadata(self, key: str) -> str | None:
        try:
            return str(self._model.meta_val_str(key))
        except ValueError:  # cyllama's answer for a key the file does not have
            return None

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        return list(self._vocab.tokenize(text, add_special=add_special, parse_special=True))

    def detokenize(self, tokens: list[int]) -> str:
        if not tokens:
            return ""
        # cyllama strips the leading whitespace of what it decodes (``.lstrip()``), so a
        # reply that starts with a space or a newline would lose it: a known token goes
        # first and its text comes off again.
        sentinel, text = self._sentinel
        decoded = str(
            self._vocab.detokenize([sentinel, *tokens], remove_special=False, unparse_special=False)
        )
        return decoded[len(text) :] if decoded.startswith(text) else decoded

    def token_text(self, token: int) -> str:
        return str(self._vocab.token_to_piece(token, special=True))

    @property
    def bos_token(self) -> int:
        return int(self._vocab.token_bos())

    @property
    def eos_token(self) -> int:
        return int(self._vocab.token_eos())

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self._vocab.is_eog(token))

    def keep(self, n: int) -> bool:
        return bool(self._ctx.memory_seq_rm(0, n, -1))

    def clear(self) -> None:
        self._ctx.kv_cache_clear()

    def save(self) -> bytes:
        return bytes(self._ctx.get_state_seq_data(0))

    def restore(self, state: bytes) -> bool:
        try:
            self._ctx.set_state_seq_data(state, 0)
        except ValueError:
            self.clear()
            return False
        return True

    def evaluate(self, tokens: list[int], pos: int) -> None:
        batch = self._batch
        for start in range(0, len(tokens), self._n_batch):
            piece = tokens[start : start + self._n_batch]
            batch.clear()
            last = len(piece) - 1
            for i, token in enumerate(piece):
                batch.add(token, pos + start + i, [0], i == last)
            self._ctx.decode(batch)

    def sampler(self, links: list[SamplerLink]) -> NativeSampler:
        chain = self._cy.LlamaSampler(self._cy.LlamaSamplerChainParams())
        try:
            for name, args in links:
                self._add(chain, name, args)
        except BaseException:
            chain.close()
            raise
        return _Sampler(chain, self._ctx)

    def _add(self, chain: Any, name: str, args: tuple[Any, ...]) -> None:
        if name == "grammar":
            self._log.take()
            chain.add_grammar(self._vocab, *args)
            failed = self._log.take()
            if failed:
                raise GrammarError("llama.cpp could not parse the GBNF grammar: " + failed[-1])
        elif name == "logit_bias":
            chain.add_logit_bias(self._n_vocab, [(int(t), float(b)) for t, b in args[0].items()])
        elif name == "penalties":
            try:  # cyllama 0.7 takes the vocabulary size first, 0.2 does not
                chain.add_penalties(self._n_vocab, *args)
            except TypeError:
                chain.add_penalties(*args)
        elif name == "mirostat":
            seed, tau, eta, m = args
            chain.add_mirostat(self._n_vocab, seed, tau, eta, m)
        else:
            getattr(chain, f"add_{name}")(*args)

    def embed(self, tokens: list[int]) -> list[float]:
        check_embeddable(tokens)
        ctx, batch = self._embedding_context()
        ctx.kv_cache_clear()
        batch.clear()
        for i, token in enumerate(tokens):
            batch.add(token, i, [0], True)
        ctx.decode(batch)
        return mean_rows([ctx.get_embeddings_ith(i) for i in range(len(tokens))])

    def _embedding_context(self) -> tuple[Any, Any]:
        if self._embedder is None:
            cy = self._cy
            params = embedding_context_params(cy.LlamaContextParams(), self._settings)
            try:
                ctx = cy.LlamaContext(self._model, params)
            except Exception as exc:
                detail = "; ".join(self._log.take()) or str(exc)
                raise RuntimeError(f"cannot create the embedding context: {detail}") from exc
            self._embedder = (ctx, cy.LlamaBatch(n_tokens=EMBED_TOKENS, embd=0, n_seq_max=1))
        return self._embedder

    def close(self) -> None:
        if self._embedder is not None:
            ctx, batch = self._embedder
            batch.close()
            ctx.close()
            self._embedder = None
        self._batch.close()
        self._ctx.close()
        self._model.close()


class _Cyllama:
    def __init__(self) -> None:
        from cyllama.llama import llama_cpp as cy

        self._cy = cy
        self._log = LogCatcher()
        # cyllama keeps the callback alive itself, and hands it each line as text.  A
        # grammar llama.cpp cannot parse is seen only here: cyllama adds the null sampler
        # it gets back to the chain without a word.
        cy.set_log_callback(self._log.line)
        cy.llama_backend_init()
        cy.ggml_backend_load_all()
        self.info = RuntimeInfo(
            name="cyllama",
            version=importlib.metadata.version("cyllama"),
            system_info=_system_info(cy),
        )

    def load(self, settings: LoadSettings) -> NativeModel:
        return _Model(self._cy, self._log, settings)


def _system_info(cy: Any) -> str:
    """The devices llama.cpp found.  cyllama's llama module has no system line (the
    instruction sets of the build); its wheels are portable builds without AMX code."""
    try:
        devices = cy.ggml_backend_dev_info()
        return " | ".join(f"{d['type']}: {d['description']}" for d in devices)
    except Exception:
        return ""


def runtime() -> Runtime:
    """The cyllama runtime (imports cyllama)."""
    return _Cyllama()
