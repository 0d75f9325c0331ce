#!/bin/sh
# "ssh" for MPICH's hydra (mpiexec -launcher ssh -launcher-exec THIS): runs
# the proxy command inside network namespace "$UCXPY_NETNS_PREFIX-<host>"
# instead of on a remote machine.  Hydra calls it like ssh: options first
# (-x ...), then the host, then the command words, which a remote shell
# would join; we do the same with sh -c.
while [ "${1#-}" != "$1" ]; do shift; done
host="$1"; shift
exec ip netns exec "${UCXPY_NETNS_PREFIX:?}-$host" sh -c "$*"
