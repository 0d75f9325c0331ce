"""Run one of shmem4py's test files on every PE of an OSHMEM job, recording
each test's outcome (adapted from ``conformance/shmem/unittest_runner.py`` for
the real shmem4py: no adapter on the path, the PE number from shmem4py).

Usage (under oshrun): ``python shmem4py_runner.py TEST_FILE OUT_DIR``.

Each PE appends JSON lines to ``OUT_DIR/pe<N>.jsonl``: ``begin`` with the
ids of the file's tests, ``start``/``stop`` per test (a test that hangs or
kills the job shows as started, never stopped), ``detail`` for a failure's
traceback, ``fixture`` for a class or module fixture's skip or error (its
tests never start), and a final ``done`` line with the counts once the whole
file ran, written before the interpreter exits (and so before
shmem_finalize, where the reference OSHMEM on the system UCX may crash): a PE
with ``done`` completed its suite.

shmem_finalize is left to shmem4py's own exit hook (``Py_AtExit``: after the
interpreter's own finalization), as when the test files run alone; with
``UCXPY_RUNNER_FINALIZE=explicit`` the runner calls ``shmem.finalize()``
itself after ``done``.
"""
import importlib.util
import json
import os
import re
import sys
import traceback
import unittest


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "shmem"))
import unittest_runner  # noqa: E402  (conformance/shmem: the per-test recording)


class RecordingResult(unittest_runner.RecordingResult):
    """conformance/shmem's recording, plus class and module fixtures (a
    ``setUpClass`` raising SkipTest or an error, reported once for all of
    its tests, which never start) and expected failures / unexpected
    successes (shmem4py's suite has them)."""

    def _set(self, test, outcome, err=None):
        tid = test.id()
        if tid not in self.outcome:
            scope = re.search(r"\((.*)\)", tid)
            self._emit(event="fixture", scope=scope.group(1) if scope else tid,
                       outcome=outcome)
        super()._set(test, outcome, err)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._set(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._set(test, "fail")


def _launcher_rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def main():
    path, outdir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        from shmem4py import shmem
        rank = shmem.my_pe()
    except Exception:
        rank = _launcher_rank()
        with open(os.path.join(outdir, f"pe{rank}.jsonl"), "a") as out:
            out.write(json.dumps({"event": "import-error",
                                  "error": traceback.format_exc()[-2000:]}) + "\n")
        raise
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)

    def ids(s):
        for t in s:
            yield from (ids(t) if isinstance(t, unittest.TestSuite) else [t.id()])
    with open(os.path.join(outdir, f"pe{rank}.jsonl"), "a") as out:
        import shmem4py
        out.write(json.dumps({"event": "begin", "tests": list(ids(suite)),
                              "shmem4py": os.path.realpath(shmem4py.__file__)}) + "\n")
        out.flush()
        stream = sys.stderr if rank == 0 else open(os.devnull, "w")
        runner = unittest.TextTestRunner(
            stream=stream, verbosity=1,
            resultclass=lambda *a, **k: RecordingResult(out, *a, **k))
        result = runner.run(suite)
        out.write(json.dumps({"event": "done", "run": result.testsRun,
                              "failures": len(result.failures), "errors": len(result.errors),
                              "skipped": len(result.skipped)}) + "\n")
        out.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get("UCXPY_RUNNER_FINALIZE") == "explicit":
        shmem.finalize()


if __name__ == "__main__":
    main()
