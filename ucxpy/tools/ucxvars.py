"""UCX's configuration names on ucxpy: what libucp makes of ``UCX_*``.

A UCP client configures UCX through the environment (``UCX_TLS=tcp``,
``UCX_RNDV_THRESH=64k``, ``UCX_NET_DEVICES=eth0``), through
``ucp_config_read``'s prefix (``UCX_<PREFIX>_<NAME>`` first) and through
``ucp_config_modify`` (NIXL sets ``RNDV_THRESH=inf`` so).  :func:`settings`
maps each name that has a ucxpy meaning to its ``UCXPY_*`` setting and
returns the others, which libucp reports once, on stderr, as ignored.  A
``UCXPY_*`` variable set in the environment wins over the UCX name that maps
to it.

Mapped (:data:`MAPPED`): ``TLS`` (UCX's transport names to ucxpy's: ``sm``,
``posix``, ``sysv``, ``cma``, ``xpmem``, ``knem`` -> shm; ``rc*``, ``ud*``,
``dc*``, ``ib`` -> verbs; ``self``, ``tcp``; ``all``; a leading ``^``
excludes; GPU transports are dropped: no GPU memory type here),
``RNDV_THRESH`` (``inf``: never by rendezvous where the transport allows),
``NET_DEVICES`` (interface names to tcp's interface, ``mlx5_0:1`` to verbs'
device; ``all``: the default).
"""
from __future__ import annotations

import os

#: UCX transport names and the ucxpy transport each one stands for
#: (None: no ucxpy meaning here: a GPU transport)
TRANSPORTS = {
    "self": "self", "tcp": "tcp",
    "sm": "shm", "shm": "shm", "posix": "shm", "sysv": "shm", "cma": "shm",
    "xpmem": "shm", "knem": "shm",
    "ib": "verbs", "rc": "verbs", "rc_v": "verbs", "rc_x": "verbs", "rc_verbs": "verbs",
    "rc_mlx5": "verbs", "ud": "verbs", "ud_v": "verbs", "ud_x": "verbs",
    "ud_verbs": "verbs", "ud_mlx5": "verbs", "dc": "verbs", "dc_x": "verbs",
    "dc_mlx5": "verbs", "srd": "verbs",
    "cuda": None, "cuda_copy": None, "cuda_ipc": None, "gdr_copy": None,
    "rocm": None, "rocm_copy": None, "rocm_ipc": None, "ze_copy": None,
}
ALL_TRANSPORTS = ("self", "shm", "tcp", "ofi", "verbs")
#: the largest threshold (UCX's ``inf``): the transport's own limit applies
INF = 1 << 62


def _tls(value: str) -> dict:
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    if not names or names == ["all"]:
        return {"UCXPY_TLS": "all"}
    exclude = names[0].startswith("^")
    if exclude:
        names[0] = names[0][1:]
    picked = []
    for n in names:
        if n not in TRANSPORTS:
            raise ValueError(f"UCX transport {n!r} has no ucxpy equivalent "
                             f"(known: {', '.join(sorted(TRANSPORTS))})")
        t = TRANSPORTS[n]
        if t is not None and t not in picked:
            picked.append(t)
    if exclude:
        picked = [t for t in ALL_TRANSPORTS if t not in picked]
    if "self" not in picked:
        picked.insert(0, "self")        # (UCX always has its loopback)
    return {"UCXPY_TLS": ",".join(picked)}


def _rndv_thresh(value: str) -> dict:
    v = value.strip().lower()
    if v in ("auto", ""):
        return {"UCXPY_RNDV_THRESH": "auto"}
    if v == "inf":
        return {"UCXPY_RNDV_THRESH": str(INF)}
    return {"UCXPY_RNDV_THRESH": value.strip()}


def _net_devices(value: str) -> dict:
    out, tcp, verbs = {}, [], []
    for dev in (d.strip() for d in value.split(",")):
        if not dev or dev == "all":
            continue
        name, _, port = dev.partition(":")
        (verbs if port or name.startswith(("mlx", "rxe", "siw", "irdma", "efa", "bnxt"))
         else tcp).append(name)
    if tcp:
        out["UCXPY_TCP_IFACE"] = ",".join(tcp)
    if verbs:
        out["UCXPY_VERBS_DEVICE"] = verbs[0]
    return out


#: UCX names (without ``UCX_``) with a ucxpy meaning: name -> translation of
#: the value into ``UCXPY_*`` settings
MAPPED = {"TLS": _tls, "RNDV_THRESH": _rndv_thresh, "NET_DEVICES": _net_devices}


def gather(prefix: str = "", modified=(), environ=None) -> dict:
    """UCX's names as a UCP client configured them: ``UCX_<NAME>`` of the
    environment, then ``UCX_<prefix>_<NAME>``, then ``modified`` (name,
    value pairs of ``ucp_config_modify``), later ones winning; name (without
    ``UCX_``) -> value."""
    env = os.environ if environ is None else environ
    out = {}
    pre = f"UCX_{prefix.rstrip('_')}_" if prefix else None
    for k, v in env.items():
        if k.startswith("UCX_") and not (pre and k.startswith(pre)):
            out[k[4:]] = v
    if pre:
        for k, v in env.items():
            if k.startswith(pre):
                out[k[len(pre):]] = v
    for name, value in modified:
        out[name.upper()] = value
    return out


def settings(names: dict, environ=None) -> tuple:
    """``(env, ignored, errors)``: the ``UCXPY_*`` settings ``names`` (from
    :func:`gather`) stand for, except those the environment sets itself;
    the names with no ucxpy meaning; and, per name, why a value could not be
    translated."""
    env = os.environ if environ is None else environ
    out, ignored, errors = {}, [], {}
    for name, value in sorted(names.items()):
        fn = MAPPED.get(name)
        if fn is None:
            ignored.append(name)
            continue
        try:
            mapped = fn(value)
        except ValueError as e:
            errors[name] = str(e)
            continue
        out.update({k: v for k, v in mapped.items() if k not in env})
    return out, ignored, errors
