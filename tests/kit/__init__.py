"""What the tests share, and the only thing a test file imports from the tests folder
(never another ``test_*.py``).

* :mod:`kit.poolkit`: pools on a FakeLLMServer, and ``conductor ARGS`` in a child
  process (``run_cli``) or in this one (``invoke_cli``);
* :mod:`kit.benchkit`: ``conductor bench`` runs on synthetic MATH files;
* :mod:`kit.records`: the one builder of run records and the directories holding them;
* :mod:`kit.servekit`: ``conductor serve``, in a thread or a process of its own;
* :mod:`kit.tinymodels`: tiny random models for the training and checkpoint tests;
* :mod:`kit.sandbox_attacks`, :mod:`kit.sandbox_escapes`: what the sandbox must stop;
* :mod:`kit.isolation`, :mod:`kit.processes`: pytest plugins (tests/conftest.py loads
  them): native-code tests in child pytest processes, and the ``process`` marker's
  check.

``tests/`` is on ``sys.path`` (pytest puts the folder of tests/conftest.py there), so
this package is ``kit``.
"""
