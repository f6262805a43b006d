"""Provider batch APIs and the wave batcher that sends a bench's calls through them.

- :mod:`~conductor.batches.api`: the one interface a provider's batch API is reached
  through (:class:`~conductor.batches.api.BatchAPI`, and ``chunk_entries`` the three
  share);
- :mod:`~conductor.batches.openai`, :mod:`~conductor.batches.anthropic`,
  :mod:`~conductor.batches.google`: one per protocol, each building its lines with its
  live client's own builder and reading answers with that client's reader;
- :mod:`~conductor.batches.waves`: :class:`~conductor.batches.waves.WaveBatcher`,
  what is sent when (whole waves), through a journal the run directory provides.

It is a floor above the model calls, because the batch APIs are built on the clients;
the caller knows the batcher only as :class:`conductor.llm.batcher.Batcher`.
"""
