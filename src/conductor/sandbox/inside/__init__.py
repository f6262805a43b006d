"""What runs inside a sandbox: its driver, standard-library files assembled into one
program (:mod:`conductor.sandbox._driver`) with the files of the caller's job driver.

* :mod:`.driver`: the first process inside: configuration, report channel, hardening,
  mounts, privileges, the seccomp filters' installation, forking, waiting for and
  sweeping children, the job pipe and the parent's word after a test, ``main``;
* :mod:`.guard`: the audit-hook guard every process that runs model code installs;
* :mod:`.program`: the ``program`` job (:func:`conductor.sandbox.run_sandboxed`).

The sandbox knows no benchmark: the code grader's job drivers, which know what a test
is and how it is judged, are :mod:`conductor.grading.drivers`.  Every file here and there
is also a real module, for linters and type checkers; what one takes from another is
imported under ``TYPE_CHECKING`` only, and at run time each imports nothing but the
standard library (inside, ``conductor`` is not importable): tests/test_layering.py checks
both.  Nothing in the parent runs them.
"""
