"""An mpi4py-compatible MPI subset on top of ucxpy: ``from mpi_shim import MPI``."""
