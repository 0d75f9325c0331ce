"""An mpi4py-compatible ``MPI`` module on ucxpy, a drop-in for unmodified
mpi4py programs: ``from mpi_shim import MPI`` (mpi4py's own test suite runs
on it: conformance/mpi)."""
