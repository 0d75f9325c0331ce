"""``python -m mpi_shim.dropin --path [mpi4py|shmem4py]``: print a drop-in's directory."""
import sys

from . import PATHS, path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "--path":
        sys.stderr.write("usage: python -m mpi_shim.dropin --path [mpi4py|shmem4py] ...\n")
        return 2
    names = argv[1:] or ["mpi4py"]
    try:
        print(":".join(dict.fromkeys(path(n) for n in names)))
    except ValueError as e:
        sys.stderr.write(f"{e}\n")
        return 2
    _ = PATHS
    return 0


if __name__ == "__main__":
    sys.exit(main())
