"""Dynamic processes: ``Spawn``, ports (``Open_port``/``Accept``/``Connect``),
name publishing and ``Join``.

Not implemented yet: every entry point raises ``MPI.Exception`` at the call
(``ERR_SPAWN`` / ``ERR_UNSUPPORTED_OPERATION``) instead of waiting.
"""
from __future__ import annotations

import os

from .engine import ENGINE
from .exceptions import ERR_PORT, ERR_SPAWN, ERR_UNSUPPORTED_OPERATION, Exception

MAX_PORT_NAME = 1024


def universe_size():
    v = os.environ.get("UCXPY_UNIVERSE_SIZE")
    return int(v) if v else ENGINE.world.size


def appnum():
    v = os.environ.get("UCXPY_APPNUM")
    return int(v) if v else None


def get_parent():
    from .intercomm import Intercomm
    return Intercomm()


def _unsupported(what, cls=ERR_UNSUPPORTED_OPERATION):
    raise Exception(cls, f"{what} is not supported by this launcher")


def spawn(comm, commands, args, maxprocs, infos, root, errcodes):
    _unsupported("MPI_Comm_spawn", ERR_SPAWN)


def spawn_multiple(comm, command, args, maxprocs, info, root, errcodes):
    _unsupported("MPI_Comm_spawn_multiple", ERR_SPAWN)


def open_port(info=None):
    _unsupported("MPI_Open_port", ERR_PORT)


def close_port(port_name):
    _unsupported("MPI_Close_port", ERR_PORT)


def accept(comm, port_name, root):
    _unsupported("MPI_Comm_accept", ERR_PORT)


def connect(comm, port_name, root):
    _unsupported("MPI_Comm_connect", ERR_PORT)


def publish_name(service_name, port_name, info=None):
    _unsupported("MPI_Publish_name")


def unpublish_name(service_name, port_name, info=None):
    _unsupported("MPI_Unpublish_name")


def lookup_name(service_name, info=None):
    _unsupported("MPI_Lookup_name")


def join(fd):
    _unsupported("MPI_Comm_join")
