"""Run one shmem4py test file on every PE, recording each test's outcome.

Usage (under a launcher): ``python unittest_runner.py TEST_FILE OUT_DIR``.
Each PE appends JSON lines to ``OUT_DIR/pe<N>.jsonl`` as tests start and
stop, so a test that hangs or kills the job still shows up (as started but
never finished).  A test with a failing subTest counts as failed.
"""
import importlib.util
import json
import os
import sys
import time
import unittest


class RecordingResult(unittest.TextTestResult):
    def __init__(self, out, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.out = out
        self.outcome = {}

    def _emit(self, **rec):
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()

    def startTest(self, test):
        super().startTest(test)
        self.outcome[test.id()] = "pass"
        self._t0 = time.monotonic()
        self._emit(event="start", test=test.id())

    def stopTest(self, test):
        super().stopTest(test)
        self._emit(event="stop", test=test.id(), outcome=self.outcome.get(test.id(), "pass"),
                   seconds=round(time.monotonic() - self._t0, 3))

    def _set(self, test, outcome, err=None):
        tid = test.id()
        if self.outcome.get(tid) in ("fail", "error"):
            return
        self.outcome[tid] = outcome
        if err is not None:
            self._emit(event="detail", test=tid, outcome=outcome,
                       error=self._exc_info_to_string(err, test)[-2000:])

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "fail", err)

    def addError(self, test, err):
        super().addError(test, err)
        self._set(test, "error", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set(test, "skip")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._set(test, "fail" if failed else "error", err)


def _launcher_rank() -> int:
    for var in ("UCXPY_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var):
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
        import shmem
        rank = shmem.my_pe() if shmem.initialized() else _launcher_rank()
    except Exception:
        rank = _launcher_rank()
        with open(os.path.join(outdir, f"pe{rank}.jsonl"), "a") as out:
            import traceback
            out.write(json.dumps({"event": "import-error",
                                  "error": traceback.format_exc()[-2000:]}) + "\n")
        raise
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    with open(os.path.join(outdir, f"pe{rank}.jsonl"), "a") as out:
        stream = sys.stderr if rank == 0 else open(os.devnull, "w")
        runner = unittest.TextTestRunner(
            stream=stream, verbosity=1,
            resultclass=lambda *a, **k: RecordingResult(out, *a, **k))
        runner.run(suite)


if __name__ == "__main__":
    main()
