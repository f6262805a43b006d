"""The local-model runtime: GGUF models run by llama.cpp, each in a host process of its
own.

- :mod:`~conductor.localmodel.models`: the parent's side, one :class:`~conductor.
  localmodel.models.ModelHost` per model file and settings in a process-wide registry
  (start, send, restart after a crash, re-send, stop), and the embedded SmolLM2 model;
- :mod:`~conductor.localmodel.crashes`: how a host died, in one sentence, and the
  native crashes this machine remembers;
- :mod:`~conductor.localmodel.host`: the child, ``python -m conductor.localmodel.host``,
  and its wire format;
- :mod:`~conductor.localmodel.generate`: the one generation loop (the chat template,
  the prompt cache, the token loop) and the pooled hidden states a router reads;
- :mod:`~conductor.localmodel.runtime`: the seam every llama.cpp binding is reached
  through, with one adapter per binding (:mod:`~conductor.localmodel.runtime_cyllama`,
  :mod:`~conductor.localmodel.runtime_llama_cpp`), chosen and imported through
  :mod:`~conductor.localmodel.runtimes`, the registry of bindings.

It is a floor below the model calls: ``client: local``'s
:class:`~conductor.llm.local_client.LocalClient` and the ``gguf-mean-v1`` router
features use it, and it imports nothing of :mod:`conductor.llm`.  A trained
checkpoint loaded in-process (transformers or vLLM, no host process) is another
engine, the checkpoint client's, and stays beside it (:mod:`conductor.llm.checkpoint_load`).
"""
