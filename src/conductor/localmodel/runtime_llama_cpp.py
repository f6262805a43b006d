"""The ``llama-cpp-python`` runtime: llama.cpp through llama-cpp-python's ctypes API.

Only the module-level functions that mirror llama.h are used (``llama_cpp.llama_*``),
not its ``Llama`` class or its private ``_internals``: the generation loop above the
seam is the project's own (:mod:`conductor.localmodel.generate`), the same for every
runtime.  Imported only inside a model's host process.
"""

from __future__ import annotations

import ctypes
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

# Every log callback handed to llama.cpp, for as long as the process lives.
_LOG_CALLBACKS: list[Any] = []


class _Sampler:
    def __init__(self, lib: Any, chain: Any, ctx: Any) -> None:
        self._lib = lib
        self._chain = chain
        self._ctx = ctx

    def sample(self) -> int:
        return int(self._lib.llama_sampler_sample(self._chain, self._ctx, -1))

    def close(self) -> None:
        if self._chain is not None:
            self._lib.llama_sampler_free(self._chain)
            self._chain = None


def _fill(batch: Any, tokens: list[int], pos: int, *, every_output: bool) -> None:
    """``batch`` holding ``tokens`` of sequence 0 at ``pos``, ``pos + 1``, ...; each one's
    output (logits, or hidden state) kept when ``every_output``."""
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i] = token
        batch.pos[i] = pos + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = every_output


class _Model:
    def __init__(self, lib: Any, log: LogCatcher, settings: LoadSettings) -> None:
        self._lib = lib
        self._log = log
        self._settings = settings
        # The embedding context and its batch, made on the first embed().
        self._embedder: tuple[Any, Any] | None = None
        params = lib.llama_model_default_params()
        params.n_gpu_layers = settings.n_gpu_layers
        if hasattr(params, "use_extra_bufts"):  # llama.cpp since mid-2025
            params.use_extra_bufts = settings.extra_buffers
        log.take()
        self._model = lib.llama_model_load_from_file(settings.path.encode("utf-8"), params)
        if not self._model:
            raise ValueError("; ".join(log.take()) or "llama.cpp could not load the file")
        self._vocab = lib.llama_model_get_vocab(self._model)
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = settings.n_ctx
        cparams.n_batch = settings.n_batch
        cparams.n_threads = settings.n_threads
        cparams.n_threads_batch = settings.n_threads
        cparams.flash_attn_type = settings.flash_attention_type
        cparams.n_seq_max = 1
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            detail = "; ".join(log.take()) or "llama.cpp refused"
            raise ValueError(f"cannot create a context of {settings.n_ctx} tokens: {detail}")
        self._memory = lib.llama_get_memory(self._ctx)
        self._n_ctx = int(lib.llama_n_ctx(self._ctx))
        self._n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._n_batch = settings.n_batch
        self._batch = lib.llama_batch_init(settings.n_batch, 0, 1)

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def metadata(self, key: str) -> str | None:
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_model_meta_val_str(self._model, key.encode("utf-8"), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        room = len(data) + 8
        while True:
            tokens = (self._lib.llama_token * room)()
            n = self._lib.llama_tokenize(
                self._vocab, data, len(data), tokens, room, add_special, True
            )
            if n >= 0:
                return list(tokens[:n])
            room = -n

    def _detokenize(self, tokens: list[int], special: bool) -> str:
        if not tokens:
            return ""
        array = (self._lib.llama_token * len(tokens))(*tokens)
        room = 8 * len(tokens) + 16
        while True:
            buf = ctypes.create_string_buffer(room)
            n = self._lib.llama_detokenize(
                self._vocab, array, len(tokens), buf, room, False, special
            )
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            room = -n

    def detokenize(self, tokens: list[int]) -> str:
        return self._detokenize(tokens, special=False)

    def token_text(self, token: int) -> str:
        return self._detokenize([token], special=True)

    @property
    def bos_token(self) -> int:
        return int(self._lib.llama_vocab_bos(self._vocab))

    @property
    def eos_token(self) -> int:
        return int(self._lib.llama_vocab_eos(self._vocab))

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    def keep(self, n: int) -> bool:
        return bool(self._lib.llama_memory_seq_rm(self._memory, 0, n, -1))

    def clear(self) -> None:
        self._lib.llama_memory_clear(self._memory, True)

    def save(self) -> bytes:
        size = int(self._lib.llama_state_seq_get_size(self._ctx, 0))
        buffer = (ctypes.c_uint8 * size)()
        written = int(self._lib.llama_state_seq_get_data(self._ctx, buffer, size, 0))
        return bytes(buffer)[:written]

    def restore(self, state: bytes) -> bool:
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if int(self._lib.llama_state_seq_set_data(self._ctx, buffer, len(state), 0)) == 0:
            self.clear()
            return False
        return True

    def evaluate(self, tokens: list[int], pos: int) -> None:
        batch = self._batch
        for start in range(0, len(tokens), self._n_batch):
            piece = tokens[start : start + self._n_batch]
            _fill(batch, piece, pos + start, every_output=False)
            batch.logits[len(piece) - 1] = True
            self._decode(self._ctx, batch)

    def _decode(self, ctx: Any, batch: Any) -> None:
        """``llama_decode``, its failure a ``RuntimeError`` with what llama.cpp logged."""
        code = int(self._lib.llama_decode(ctx, batch))
        if code != 0:
            detail = "; ".join(self._log.take())
            raise RuntimeError(f"llama_decode returned {code}" + (f": {detail}" if detail else ""))

    def sampler(self, links: list[SamplerLink]) -> NativeSampler:
        lib = self._lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        sampler = _Sampler(lib, chain, self._ctx)
        try:
            for name, args in links:
                link = self._link(name, args)
                if not link:
                    detail = "; ".join(self._log.take())
                    if name == "grammar":
                        raise GrammarError(
                            "llama.cpp could not parse the GBNF grammar"
                            + (f": {detail}" if detail else "")
                        )
                    raise ValueError(f"llama.cpp refused the {name} sampler {args!r}")
                lib.llama_sampler_chain_add(chain, link)
        except BaseException:
            sampler.close()
            raise
        return sampler

    def _link(self, name: str, args: tuple[Any, ...]) -> Any:
        lib = self._lib
        if name == "grammar":
            grammar, root = args
            self._log.take()
            return lib.llama_sampler_init_grammar(
                self._vocab, grammar.encode("utf-8"), root.encode("utf-8")
            )
        if name == "logit_bias":
            biases = list(args[0].items())
            array = (lib.llama_logit_bias * len(biases))()
            for i, (token, bias) in enumerate(biases):
                array[i].token = int(token)
                array[i].bias = float(bias)
            return lib.llama_sampler_init_logit_bias(self._n_vocab, len(biases), array)
        if name == "penalties":
            return lib.llama_sampler_init_penalties(self._n_vocab, *args)
        if name == "mirostat":
            return lib.llama_sampler_init_mirostat(self._n_vocab, *args)
        return getattr(lib, f"llama_sampler_init_{name}")(*args)

    def embed(self, tokens: list[int]) -> list[float]:
        check_embeddable(tokens)
        lib = self._lib
        ctx, batch = self._embedding_context()
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
        _fill(batch, tokens, 0, every_output=True)
        self._decode(ctx, batch)
        n_embd = int(lib.llama_model_n_embd(self._model))
        rows = []
        for i in range(len(tokens)):
            row = lib.llama_get_embeddings_ith(ctx, i)
            if not row:
                raise RuntimeError(f"llama.cpp kept no hidden state for token {i}")
            rows.append(row[:n_embd])
        return mean_rows(rows)

    def _embedding_context(self) -> tuple[Any, Any]:
        if self._embedder is None:
            lib = self._lib
            params = embedding_context_params(lib.llama_context_default_params(), self._settings)
            ctx = lib.llama_init_from_model(self._model, params)
            if not ctx:
                detail = "; ".join(self._log.take()) or "llama.cpp refused"
                raise RuntimeError(f"cannot create the embedding context: {detail}")
            self._embedder = (ctx, lib.llama_batch_init(EMBED_TOKENS, 0, 1))
        return self._embedder

    def close(self) -> None:
        if self._embedder is not None:
            ctx, batch = self._embedder
            self._lib.llama_batch_free(batch)
            self._lib.llama_free(ctx)
            self._embedder = None
        if self._ctx:
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = None


class _LlamaCppPython:
    def __init__(self) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self._log = LogCatcher()

        def line(level: int, text: bytes | None, _data: Any) -> None:
            self._log.line(level, (text or b"").decode("utf-8", errors="replace"))

        # llama.cpp keeps the pointer for the life of the process and ctypes does not
        # keep the callback alive: freed, the next log line would jump into freed memory.
        callback = llama_cpp.llama_log_callback(line)
        _LOG_CALLBACKS.append(callback)
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        self.info = RuntimeInfo(
            name="llama-cpp-python",
            version=str(getattr(llama_cpp, "__version__", "?")),
            system_info=llama_cpp.llama_print_system_info().decode("utf-8", errors="replace"),
        )

    def load(self, settings: LoadSettings) -> NativeModel:
        return _Model(self._lib, self._log, settings)


def runtime() -> Runtime:
    """The llama-cpp-python runtime (imports llama_cpp)."""
    return _LlamaCppPython()
