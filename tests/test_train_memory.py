"""The format warm start gives its memory back: after it, the process holds the model and
not its gradients or the optimizer's moments (three times the model, which GRPO would
otherwise find still held when it builds its own optimizer: the first CPU run's peak).

The warm start runs in a fresh process (a clean resident set to measure) on a model
built there whose parameter-sized blocks are a few MB each, the sizes glibc keeps in its
heaps when they are freed rather than unmapping them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

pytestmark = [pytest.mark.process, pytest.mark.isolated]

TESTS = Path(__file__).resolve().parent

CHILD = r"""
import json, os, random, sys
import torch
from kit.tinymodels import tiny_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM
from conductor.train.settings import WarmStartSettings
from conductor.train.warmstart import format_warm_start, warm_start_target

torch.set_num_threads(1)

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

messages = [[{"role": "user", "content": f"Models: Model 0, Model 1. Q{i}: what is {i} + {i}?"}]
            for i in range(8)]
corpus = [m[0]["content"] for m in messages] + [
    warm_start_target(random.Random(i), 2, max_steps=2) for i in range(20)]
tok = tiny_tokenizer(corpus)
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=len(tok), hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True))
rows = [{"prompt": m, "worker_ids": ["a", "b"]} for m in messages]
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
before = rss()
report = format_warm_start(model, tok, rows, WarmStartSettings(passes=2, batch_size=8),
                           max_steps=2, seed=0, micro_batch=2)
after = rss()
print(json.dumps({"before": before, "after": after, "model": model_bytes,
                  "batches": len(report.losses),
                  "grads_left": sum(p.grad is not None for p in model.parameters())}))
"""


def test_warm_start_returns_its_gradients_and_optimizer_memory() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # Kept, the gradients (1x the model) and AdamW's moments (2x) would add ~3x the model
    # (~50 MB here) to the resident set; returned, what is left is allocator slack.
    grown = got["after"] - got["before"]
    assert grown < 0.5 * got["model"], (grown / 1e6, got["model"] / 1e6)
    assert got["batches"] == 2 and got["grads_left"] == 0
