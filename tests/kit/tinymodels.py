"""Tiny transformers models built in the test process (nothing is downloaded).

Shared by the checkpoint and training tests: a byte-level BPE tokenizer trained on a
small corpus (exact round trip of any text) with a simple chat template, and a
two-layer Llama sized to it.  By default the tokenizer adds no special tokens to a text
and its template writes none (as SmolLM2's and Qwen's); with ``adds_bos`` it is shaped
like Llama's, Gemma's and Mistral's: the tokenizer puts BOS before every text it
encodes with special tokens, and the chat template begins with ``{{ bos_token }}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: :data:`CHAT_TEMPLATE` opening with BOS, as Llama's, Gemma's and Mistral's templates do.
BOS_CHAT_TEMPLATE = "{{ bos_token }}" + CHAT_TEMPLATE
BOS = "<|bos|>"


def tiny_tokenizer(
    corpus: Sequence[str], *, chat_template: bool = True, adds_bos: bool = False
) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus``; with ``adds_bos`` one that
    prepends BOS to what it encodes with special tokens (tokenizers' own
    ``TemplateProcessing``, kept when saved) and whose template writes BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|end|>", BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) * 4, trainer=trainer)
    if adds_bos:
        bos_id = tok.token_to_id(BOS)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|end|>", bos_token=BOS, pad_token="<|end|>"
    )
    if chat_template:
        fast.chat_template = BOS_CHAT_TEMPLATE if adds_bos else CHAT_TEMPLATE
    return fast


def tiny_llama(tokenizer: Any, *, seed: int = 0, max_positions: int = 256) -> Any:
    """A randomly initialised two-layer Llama for ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def overfit(
    model: Any,
    tokenizer: Any,
    examples: Sequence[tuple[str, str]],
    *,
    steps: int,
    stop_below: float | None = None,
    lr: float = 1e-2,
) -> float:
    """Train ``model`` to write each target (then EOS) after its prompt text; only the
    target's tokens carry loss.  One pass over ``examples`` per step, at most ``steps``,
    stopping once the pass's mean loss is below ``stop_below``.  Returns that mean."""
    import torch

    batch = []
    for prompt, target in examples:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
        batch.append((len(prompt_ids), [*prompt_ids, *target_ids, tokenizer.eos_token_id]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    mean = float("inf")
    for _ in range(steps):
        total = 0.0
        for start, ids in batch:
            x = torch.tensor([ids])
            labels = x.clone()
            labels[0, :start] = -100
            loss = model(input_ids=x, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        mean = total / len(batch)
        if stop_below is not None and mean < stop_below:
            break
    return mean
