"""The llama.cpp runtimes behind ``client: local`` and the one generation loop above them.

Checked against a reference we did not write: llama-cpp-python's own ``Llama`` class
(its chat formatter, tokenizer and ``create_chat_completion``), which our loop must
reproduce token for token when it runs on the same library with the same settings.
Every runtime installed here is tested the same way; CI installs cyllama (the default)
and, in a step of its own, llama-cpp-python.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kit.poolkit import embedded_model_or_skip

from conductor.localmodel.generate import (
    CHATML_TEMPLATE,
    ChatTemplate,
    ContextOverflow,
    GenerationCancelled,
    Generator,
    TemplateError,
)
from conductor.localmodel.runtime import (
    GrammarError,
    LoadSettings,
    SamplerSettings,
    sampler_links,
)
from conductor.localmodel.runtimes import installed_runtimes, load_runtime

# llama.cpp runs in this process here: a crash fails one test, not the run.
pytestmark = pytest.mark.isolated

RUNTIMES = installed_runtimes()


def _settings(**kwargs: Any) -> LoadSettings:
    path = str(embedded_model_or_skip())
    return LoadSettings(path=path, n_ctx=kwargs.pop("n_ctx", 1024), n_threads=1, **kwargs)


@pytest.fixture(scope="module", params=RUNTIMES or ["none"])
def generator(request: pytest.FixtureRequest) -> Iterator[Generator]:
    """A generator per installed runtime (flash attention off, as llama-cpp-python's
    ``Llama`` has it, so the two can be compared token for token)."""
    if request.param == "none":
        pytest.skip("no llama.cpp runtime is installed")
    settings = _settings(flash_attention=False)
    model = load_runtime(request.param).load(settings)
    yield Generator(model, cached=4)
    model.close()


@pytest.fixture(scope="module")
def reference() -> Any:
    """llama-cpp-python's ``Llama`` on the embedded model, where it is installed."""
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=_settings().path, n_ctx=1024, n_threads=1, verbose=False)


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "user", "content": "Q: 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3? Réponds en français ✓"},
    ],
]


# -- the sampler chain, no model --------------------------------------------------


def test_the_chain_is_llama_cpp_pythons_order() -> None:
    names = [name for name, _ in sampler_links(SamplerSettings(repeat_penalty=1.1), "g")]
    assert names == ["penalties", "grammar", "top_k", "typical", "top_p", "min_p", "temp", "dist"]
    assert [n for n, _ in sampler_links(SamplerSettings(temperature=0.0), None)] == ["greedy"]
    assert [n for n, _ in sampler_links(SamplerSettings(temperature=-1.0), None)] == ["dist"]
    miro = sampler_links(SamplerSettings(mirostat_mode=2, logit_bias={5: -1.0}), None)
    assert [n for n, _ in miro] == ["logit_bias", "temp", "mirostat_v2"]
    seeded = dict(sampler_links(SamplerSettings(seed=-1), None))
    assert seeded["dist"] == (0xFFFFFFFF,)  # llama.cpp takes an unsigned 32-bit seed


# -- templates, no model ------------------------------------------------------------


def test_a_hostile_chat_template_cannot_reach_python() -> None:
    # A GGUF file's template is its author's code: the sandbox refuses attribute games.
    hostile = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(TemplateError):
        ChatTemplate(hostile, bos="", eos="").render([{"role": "user", "content": "x"}])
    refusing = "{{ raise_exception('no system messages') }}"
    with pytest.raises(TemplateError, match="no system messages"):
        ChatTemplate(refusing, bos="", eos="").render([{"role": "user", "content": "x"}])
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for %}", bos="", eos="")


def test_a_file_without_a_template_gets_chatml() -> None:
    text = ChatTemplate(None, bos="", eos="").render([{"role": "user", "content": "hi"}])
    assert ChatTemplate(None, bos="", eos="").source == CHATML_TEMPLATE
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# -- on the model, every runtime ------------------------------------------------------


def test_text_survives_tokens_byte_for_byte(generator: Generator) -> None:
    model = generator.model
    for text in ("héllo ✓ wörld 数学 🎉", " leading space", "tabs\tand\nnewlines", "a" * 5000):
        assert model.detokenize(model.tokenize(text, add_special=False)) == text


def test_special_tokens_are_parsed_in_prompts(generator: Generator) -> None:
    model = generator.model
    tokens = model.tokenize("<|im_start|>user", add_special=False)
    assert model.token_text(tokens[0]) == "<|im_start|>"


def test_a_broken_grammar_is_refused_before_anything_runs(generator: Generator) -> None:
    for broken in ('root ::= "open', "root ::= ( a", "start ::= [a-z]+"):
        with pytest.raises(GrammarError):
            generator.generate(
                CONVERSATIONS[0], SamplerSettings(temperature=0), max_tokens=4, grammar=broken
            )
    # The model is fine afterwards.
    assert generator.generate(CONVERSATIONS[0], SamplerSettings(temperature=0), max_tokens=4).text


def test_the_grammar_holds_the_reply(generator: Generator) -> None:
    grammar = 'root ::= "Answer: " ("yes" | "no") "."'
    reply = generator.generate(
        [{"role": "user", "content": "Is water wet?"}],
        SamplerSettings(temperature=1.5, seed=3),
        max_tokens=20,
        grammar=grammar,
    )
    assert reply.text in ("Answer: yes.", "Answer: no.") and reply.finish_reason == "stop"


def test_a_prompt_too_long_for_the_context_is_refused(generator: Generator) -> None:
    with pytest.raises(ContextOverflow, match="context window"):
        generator.generate(
            [{"role": "user", "content": "word " * 2000}], SamplerSettings(), max_tokens=4
        )


def test_max_tokens_and_the_context_end_a_reply_with_length(generator: Generator) -> None:
    reply = generator.generate(
        [{"role": "user", "content": "Count from 1 to 100."}],
        SamplerSettings(temperature=0),
        max_tokens=5,
    )
    assert reply.completion_tokens == 5 and reply.finish_reason == "length"


def test_cancelling_stops_within_a_token(generator: Generator) -> None:
    asked: list[int] = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 8  # the prompt pieces, then a few tokens

    with pytest.raises(GenerationCancelled):
        generator.generate(
            [{"role": "user", "content": "Count from 1 to 100."}],
            SamplerSettings(temperature=0),
            max_tokens=200,
            cancelled=cancelled,
        )
    assert len(asked) == 9  # asked before every piece and token, stopped at the first yes
    # The model's memory is consistent: the same question answers as from fresh.
    again = generator.generate(
        [{"role": "user", "content": "Count from 1 to 5."}],
        SamplerSettings(temperature=0),
        max_tokens=12,
    )
    assert again.text.strip()


def test_the_prompt_cache_saves_work_and_changes_nothing(generator: Generator) -> None:
    preamble = "You plan work for a team. " * 20
    first = [{"role": "user", "content": preamble + "Question: what is 2 + 3?"}]
    second = [{"role": "user", "content": preamble + "Question: name a prime number."}]
    generator.generate(first, SamplerSettings(temperature=0), max_tokens=8)
    cached = generator.generate(second, SamplerSettings(temperature=0), max_tokens=16)
    assert cached.cached_tokens > 100  # the shared preamble was not evaluated again
    generator.forget()
    fresh = generator.generate(second, SamplerSettings(temperature=0), max_tokens=16)
    assert fresh.cached_tokens == 0
    assert fresh.text == cached.text


def test_a_preamble_keeps_its_cache_while_other_calls_come_and_go(generator: Generator) -> None:
    generator.forget()
    preamble = "You plan work for a team of models and never answer yourself. " * 12
    greedy = SamplerSettings(temperature=0)
    generator.generate([{"role": "user", "content": preamble + "Q: 2 + 3?"}], greedy, max_tokens=4)
    for other in ("Name a colour.", "Name a fruit.", "Name a city.", "Name a river."):
        generator.generate([{"role": "user", "content": other}], greedy, max_tokens=4)
    again = generator.generate(
        [{"role": "user", "content": preamble + "Q: 7 * 6?"}], greedy, max_tokens=4
    )
    assert again.cached_tokens > 100  # the four short calls did not push the preamble out


def test_a_full_memory_makes_room_instead_of_failing(generator: Generator) -> None:
    # Each prompt takes most of the 1024-position window shared by the sequences.
    generator.forget()
    greedy = SamplerSettings(temperature=0)
    for word in ("alpha", "beta", "gamma", "delta", "alpha"):
        reply = generator.generate(
            [{"role": "user", "content": f"{word} " * 380 + "Summarise."}], greedy, max_tokens=16
        )
        assert reply.finish_reason in ("stop", "length") and reply.prompt_tokens > 380
        slots = generator._slots
        saved = sum(len(t) for i, t in enumerate(slots.held) if i != slots.live)
        assert saved <= generator.model.n_ctx  # the copies take no more than the memory
        assert [
            t for t, state in zip(slots.held, slots.saved, strict=True) if t and state is None
        ] == [slots.held[slots.live]]


def test_a_seeded_sample_does_not_depend_on_what_the_cache_holds(generator: Generator) -> None:
    # The failure this guards against: with the cached prompts as sequences of one
    # memory, the same prompt and seed gave another reply once another prompt was
    # cached before it (its logits depend on where in the memory it lies).
    question = [{"role": "user", "content": "Invent a name for a pet dragon."}]
    warm = SamplerSettings(temperature=1.2, top_k=0, top_p=1.0, seed=0)
    generator.forget()
    fresh = generator.generate(question, warm, max_tokens=24).text
    for words in (3, 7, 12, 30, 61):
        generator.forget()
        other = [{"role": "user", "content": "Plan the work of a team. " * words}]
        generator.generate(other, warm, max_tokens=8)
        assert generator.generate(question, warm, max_tokens=24).text == fresh, words
        again = generator.generate(question, warm, max_tokens=24)
        assert again.cached_tokens > 0 and again.text == fresh, words


def test_a_saved_copy_the_runtime_refuses_is_evaluated_again(generator: Generator) -> None:
    generator.forget()
    greedy = SamplerSettings(temperature=0)
    preamble = "You plan work for a team of models and never answer yourself. " * 8
    question = [{"role": "user", "content": preamble + "Name three rivers of Europe."}]
    first = generator.generate(question, greedy, max_tokens=12)
    generator.generate([{"role": "user", "content": "Name a fruit."}], greedy, max_tokens=4)
    slots = generator._slots
    (copy,) = [i for i, state in enumerate(slots.saved) if state is not None]
    slots.saved[copy] = b"\x00\x01 not a llama.cpp state"
    again = generator.generate(question, greedy, max_tokens=12)
    assert again.cached_tokens == 0 and again.text == first.text


# -- against llama-cpp-python's own Llama class --------------------------------------


def test_prompts_are_llama_cpp_pythons_token_for_token(
    generator: Generator, reference: Any
) -> None:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = reference.metadata["tokenizer.chat_template"]
    formatter = Jinja2ChatFormatter(
        template=template,
        eos_token=generator.template.eos,
        bos_token=generator.template.bos,
    )
    for messages in CONVERSATIONS:
        theirs = formatter(messages=messages).prompt
        assert generator.template.render(messages) == theirs
        assert generator.prompt_tokens(messages) == reference.tokenize(
            theirs.encode("utf-8"), add_bos=True, special=True
        )


SAMPLINGS = [
    {"temperature": 0.0},
    {"temperature": 0.7, "seed": 5},
    {"temperature": 1.0, "seed": 11, "top_k": 10, "top_p": 0.9, "min_p": 0.1},
    {"temperature": 0.8, "seed": 3, "repeat_penalty": 1.3},
]


@pytest.mark.parametrize(
    "sampling", SAMPLINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_replies_are_llama_cpp_pythons_on_the_same_library(
    generator: Generator, reference: Any, sampling: dict[str, Any]
) -> None:
    # Only where both run one llama.cpp build: another build rounds differently.
    runtime = generator.model.__class__.__module__
    if not runtime.endswith("runtime_llama_cpp"):
        pytest.skip("cyllama bundles another llama.cpp build than llama-cpp-python")
    for messages in CONVERSATIONS[1:]:
        # Both from an empty cache: a prompt read in other pieces rounds differently.
        reference.reset()
        generator.forget()
        theirs = reference.create_chat_completion(messages=messages, max_tokens=30, **sampling)
        ours = generator.generate(messages, SamplerSettings(**sampling), max_tokens=30)
        assert ours.text == theirs["choices"][0]["message"]["content"]
        assert ours.prompt_tokens == theirs["usage"]["prompt_tokens"]
        assert ours.finish_reason == theirs["choices"][0]["finish_reason"]


def test_grammar_and_stop_replies_are_llama_cpp_pythons(
    generator: Generator, reference: Any
) -> None:
    import llama_cpp

    if not generator.model.__class__.__module__.endswith("runtime_llama_cpp"):
        pytest.skip("cyllama bundles another llama.cpp build than llama-cpp-python")
    messages = [{"role": "user", "content": "Name a colour and a fruit."}]
    grammar = 'root ::= "Colour: " [a-z]+ ", fruit: " [a-z]+'
    reference.reset()
    generator.forget()
    theirs = reference.create_chat_completion(
        messages=messages,
        max_tokens=30,
        temperature=0.0,
        grammar=llama_cpp.LlamaGrammar.from_string(grammar, verbose=False),
    )
    ours = generator.generate(
        messages, SamplerSettings(temperature=0.0), max_tokens=30, grammar=grammar
    )
    assert ours.text == theirs["choices"][0]["message"]["content"]
    reference.reset()
    generator.forget()
    theirs = reference.create_chat_completion(
        messages=messages, max_tokens=30, temperature=0.0, stop=[","]
    )
    ours = generator.generate(messages, SamplerSettings(temperature=0.0), max_tokens=30, stop=[","])
    assert ours.text == theirs["choices"][0]["message"]["content"]
    assert ours.finish_reason == theirs["choices"][0]["finish_reason"] == "stop"


# -- embeddings (a router's gguf-mean-v1 features) ----------------------------------

TEXTS = ["What is 17 * 23?", "Name the capital of France.", "Convert 3 km to metres."]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def test_embeddings_are_the_models_width_repeatable_and_tell_texts_apart(
    generator: Generator,
) -> None:
    width = int(generator.model.metadata("llama.embedding_length") or 0)
    first = generator.embed(TEXTS)
    again = generator.embed(list(reversed(TEXTS)))
    assert width == 576 and [len(v) for v in first.vectors] == [width] * 3
    # The same text gives the same vector, whatever was read before it.
    assert first.vectors == list(reversed(again.vectors))
    assert all(0 < n < 20 for n in first.tokens)
    pairs = [(0, 1), (0, 2), (1, 2)]
    assert all(_cosine(first.vectors[i], first.vectors[j]) < 0.999 for i, j in pairs)


def test_embedding_leaves_the_generations_memory_and_cache_alone(generator: Generator) -> None:
    preamble = "You plan work for a team. " * 20
    asked = [{"role": "user", "content": preamble + "Question: what is 2 + 3?"}]
    before = generator.generate(asked, SamplerSettings(temperature=0), max_tokens=12)
    generator.embed(TEXTS)
    after = generator.generate(asked, SamplerSettings(temperature=0), max_tokens=12)
    assert after.text == before.text
    assert after.cached_tokens == after.prompt_tokens - 1  # the cache survived the embed


def test_a_long_text_is_read_by_its_two_ends_and_an_empty_one_still_embeds(
    generator: Generator,
) -> None:
    from conductor.localmodel.runtime import EMBED_TOKENS

    long = "alpha " * 2000 + "Which planet is largest?"
    done = generator.embed([long, ""])
    assert done.tokens[0] == EMBED_TOKENS and done.tokens[1] >= 1
    # The question at the end is read: another ending, another vector.
    other = generator.embed(["alpha " * 2000 + "What is 2 + 2?"])
    assert other.vectors[0] != done.vectors[0]
    with pytest.raises(ValueError):
        generator.model.embed([])
    with pytest.raises(ValueError):
        generator.model.embed([1] * (EMBED_TOKENS + 1))


def test_embeddings_are_llama_cpps_own_mean_pooling(generator: Generator) -> None:
    """Checked against llama.cpp's own mean pooling, through llama-cpp-python's ``Llama``
    (its ``embed`` with ``pooling_type`` mean), on the same library."""
    llama_cpp = pytest.importorskip("llama_cpp")
    if not generator.model.__class__.__module__.endswith("runtime_llama_cpp"):
        pytest.skip("cyllama bundles another llama.cpp build than llama-cpp-python")
    reference = llama_cpp.Llama(
        model_path=_settings().path,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=1,
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        verbose=False,
    )
    ours = generator.embed(TEXTS).vectors
    for text, vector in zip(TEXTS, ours, strict=True):
        theirs = reference.embed(text, normalize=False)
        assert len(theirs) == len(vector)
        assert max(abs(a - b) for a, b in zip(vector, theirs, strict=True)) < 1e-3
        assert _cosine(vector, theirs) > 0.99999
