"""Run one mpi4py test module against mpi_shim, on every rank of the job.

Usage: runner.py IMPL TESTDIR MODULE OUTDIR, IMPL being ``shim`` (mpi4py is
the adapter over mpi_shim) or ``ref``, ``ucp``, ``ref-ucx``, ``ompi-ucp``,
``ompi-ref`` (the installed mpi4py; run.py sets the environment that puts it
on MPICH or Open MPI, over ucxpy's libucp.so.0 or the real UCX).  Each rank
writes OUTDIR/MODULE.<rank>.json
mapping test id -> "pass" | "fail" | "error" | "skip" (a test with a failing
subtest counts as failed).
"""
import json
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# mpi4py.futures servers (test_util_pool) run the parent's main script
# under another name, to resolve pickled functions: nothing to do there.
if __name__ == "__main__":
    impl, testdir, module, outdir = sys.argv[1:5]
    if impl == "shim":
        sys.path[:0] = [os.path.join(ROOT, "mpi_shim", "dropin"), ROOT]
    sys.path.insert(0, testdir)

    if os.environ.get("CONFORMANCE_TRACE_AFTER"):     # debugging hangs
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["CONFORMANCE_TRACE_AFTER"]), exit=True)

    from mpi4py import MPI  # noqa: E402  (shim: the adapter over mpi_shim.MPI)

    rank = MPI.COMM_WORLD.Get_rank()
    outcome = {}
    out_path = os.path.join(outdir, f"{module}.{rank}.json")


    def _save():
        with open(out_path + ".tmp", "w") as f:
            json.dump(outcome, f)
        os.replace(out_path + ".tmp", out_path)


    class Result(unittest.TestResult):
        def startTest(self, test):
            super().startTest(test)
            outcome[test.id()] = "running"
            self._t0 = time.monotonic()
            _save()

        def addSuccess(self, test):
            if outcome.get(test.id()) == "running":
                outcome[test.id()] = "pass"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcome[test.id()] = "fail"
            self._log(test, err)

        def addError(self, test, err):
            super().addError(test, err)
            outcome[getattr(test, "id", lambda: str(test))()] = "error"
            self._log(test, err)

        def addSkip(self, test, reason):
            outcome[test.id()] = "skip"

        def addExpectedFailure(self, test, err):
            outcome[test.id()] = "pass"

        def addUnexpectedSuccess(self, test):
            outcome[test.id()] = "pass"

        def addSubTest(self, test, subtest, err):
            if err is not None:
                tid = test.id()
                if issubclass(err[0], unittest.SkipTest):
                    return
                outcome[tid] = "fail" if issubclass(err[0], test.failureException) else "error"
                self._log(subtest, err)

        def _log(self, test, err):
            if os.environ.get("CONFORMANCE_VERBOSE") and rank == 0:
                import traceback
                print(f"--- {test}", "".join(traceback.format_exception(*err))[-1500:],
                      file=sys.stderr, flush=True)

        def stopTest(self, test):
            super().stopTest(test)
            _save()


    mod = __import__(module)
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)


    def _flat(s):
        for t in s:
            yield from (_flat(t) if isinstance(t, unittest.TestSuite) else [t])


    pattern = os.environ.get("CONFORMANCE_K")
    if pattern:
        suite = unittest.TestSuite(t for t in _flat(suite) if pattern in t.id())
    # run.py's MPICH_RACES / OPENMPI_BUGS: not run, counted as skips
    excluded = set(filter(None, os.environ.get("CONFORMANCE_EXCLUDE", "").split(",")))
    if excluded:
        suite = unittest.TestSuite(t for t in _flat(suite) if t.id() not in excluded)
    for t in _flat(suite):              # tests a killed job never reached count as errors
        outcome[t.id()] = "notrun"
    for t in excluded:
        outcome[t] = "skip"
    suite.run(Result())
    _save()
    MPI.COMM_WORLD.Barrier()
    MPI.Finalize()
