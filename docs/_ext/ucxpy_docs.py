"""ucxpy's own Sphinx directives: pages generated from the code and from
committed result snapshots, so that they cannot drift.

``ucxpy-config``
    Every declared ``UCXPY_*`` variable (:func:`ucxpy.config.variables`),
    by component, with its default and documentation.

``results-table`` *name*
    A table from the snapshot ``docs/results/<name>.json``
    (:mod:`ucxpy.tools.snapshot`): ``:key:`` is the dotted path of a list of
    records in the runner's data (dicts, or lists whose keys are their
    positions "0", "1", ...; a dict of records gives each a "label"),
    ``:columns:`` the keys shown, dotted paths allowed (``key=Header``
    renames one).  The snapshot's date, commit and command follow the table.

``results-plot`` *name*
    A figure drawn at build time from a snapshot by one of the plotters in
    :data:`PLOTTERS` (``:kind:``); the same stamp follows it.

A snapshot that is missing, or a key that is not in it, fails the build.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from sphinx.errors import ExtensionError

from ucxpy.tools import snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.dirname(HERE)
ROOT = os.path.dirname(DOCS)
GENERATED = "_generated"


def load(name: str) -> dict:
    """Snapshot ``name`` (:func:`ucxpy.tools.snapshot.load`), checked."""
    try:
        snap = snapshot.load(name)
    except FileNotFoundError:
        raise ExtensionError(f"no result snapshot docs/results/{name}.json: run the "
                             f"runner that writes it with --snapshot and commit it") from None
    for key in ("date", "commit", "command", "data"):
        if key not in snap:
            raise ExtensionError(f"docs/results/{name}.json has no {key!r}")
    return snap


def dig(data, key: str):
    for part in key.split(".") if key else ():
        if isinstance(data, list):
            data = data[int(part)]
        elif not isinstance(data, dict) or part not in data:
            raise ExtensionError(f"no {key!r} in the snapshot (stopped at {part!r})")
        else:
            data = data[part]
    return data


def fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100:
            return f"{v:.0f}"
        if a >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, dict):
        if v and all(isinstance(x, int) for x in v.values()):     # counts: the non-zero ones
            return ", ".join(f"{x} {k}" for k, x in v.items() if x) or "0"
        return ", ".join(f"{k}: {fmt(x)}" for k, x in v.items())
    return str(v)


def size(v) -> str:
    """8 -> '8 B', 16384 -> '16 KiB', 1048576 -> '1 MiB'."""
    if not isinstance(v, int) or isinstance(v, bool):
        return fmt(v)
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if v >= 1 << shift and v % (1 << shift) == 0:
            return f"{v >> shift} {unit}"
    return f"{v} B"


def field(record: dict, key: str):
    """``record[key]``, or along a dotted path ("ours.ok"); None when absent."""
    if key in record or "." not in key:
        return record.get(key)
    try:
        return dig(record, key)
    except (ExtensionError, IndexError, ValueError):
        return None


def cell(key: str, v) -> str:
    return size(v) if key in ("size", "bytes") else fmt(v)


def stamp(name: str, snap: dict) -> nodes.paragraph:
    para = nodes.paragraph(classes=["results-stamp"])
    para += nodes.emphasis(text=f"From docs/results/{name}.json: {snap['date'].replace('T', ' ')}, "
                                f"commit {snap['commit']}{' (modified tree)' if snap.get('dirty') else ''}, ")
    para += nodes.literal(text=snap["command"])
    para += nodes.emphasis(text=".")
    return para


def table(header: list, rows: list) -> nodes.table:
    tbl = nodes.table()
    group = nodes.tgroup(cols=len(header))
    tbl += group
    for _ in header:
        group += nodes.colspec(colwidth=1)

    def row(cells):
        r = nodes.row()
        for c in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=c)
            r += entry
        return r
    head = nodes.thead()
    head += row(header)
    group += head
    body = nodes.tbody()
    for cells in rows:
        body += row(cells)
    group += body
    return tbl


class ResultsTable(Directive):
    required_arguments = 1
    option_spec = {"key": directives.unchanged, "columns": directives.unchanged}

    def run(self):
        name = self.arguments[0]
        snap = load(name)
        records = dig(snap["data"], self.options.get("key", ""))
        if isinstance(records, dict):       # {label: record} -> records with a "label"
            records = [{"label": k, **(v if isinstance(v, dict) else {"value": v})}
                       for k, v in records.items()]
        if isinstance(records, list):       # rows as lists: keys "0", "1", ...
            records = [{str(i): v for i, v in enumerate(r)} if isinstance(r, (list, tuple))
                       else r for r in records]
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise ExtensionError(f"{name}: {self.options.get('key')!r} is not a list of records")
        cols = self.options.get("columns")
        if cols:
            spec = [c.strip().partition("=") for c in cols.split(",") if c.strip()]
            keys = [k.strip() for k, _, _ in spec]
            header = [(h or k).strip() for k, _, h in spec]
        else:
            keys = list(dict.fromkeys(k for r in records for k in r))
            header = keys
        if not records:
            raise ExtensionError(f"{name}: no records for {self.options}")
        return [table(header, [[cell(k, field(r, k)) for k in keys] for r in records]),
                stamp(name, snap)]


# ------------------------------------------------------------------ plots

def _bench_module():
    spec = importlib.util.spec_from_file_location("_ucxpy_run_bench",
                                                  os.path.join(ROOT, "bench", "run_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plot_bench(snap: dict, path: str) -> None:
    """The bench's own figure (bench/run_bench.py's plot) from the snapshot."""
    _bench_module().plot(snap["data"]["impls"], path,
                         title=f"make bench, {snap['date'][:10]} ({snap['commit']})")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _axes(ax, xlabel: str, ylabel: str, logx=True, logy=True, title="") -> None:
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)


def _save(plt, fig, snap: dict, path: str) -> None:
    """The figure, titled with its snapshot's name, date and commit."""
    fig.suptitle(f"{snap['name']}, {snap['date'][:10]} ({snap['commit']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_columns(snap: dict, path: str, key: str, x: str, y: str, xlabel: str, ylabel: str,
                 logx=True, logy=True) -> None:
    """Records at ``key`` (one per ``x``; a dict of such lists, or several
    comma-separated keys: one panel each) as one line per column named in
    ``y`` (comma-separated)."""
    plt = _pyplot()
    if "," in key:          # one panel per key
        panels = {k.strip().split(".")[-1]: dig(snap["data"], k.strip()) for k in key.split(",")}
    else:
        data = dig(snap["data"], key)
        panels = data if isinstance(data, dict) else {"": data}
    cols = [c.strip() for c in y.split(",")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, (title, records) in zip(axes.flat, panels.items()):
        for col in cols:
            pts = sorted((r[x], r[col]) for r in records if r.get(col) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=col)
        _axes(ax, xlabel, ylabel, logx, logy, title)
    _save(plt, fig, snap, path)


def _number(k):
    try:
        return float(k)
    except (TypeError, ValueError):
        return None


def plot_mapping(snap: dict, path: str, key: str, xlabel: str, ylabel: str, y=None,
                 select=None, invert=False, scale=1.0, logx=True, logy=True) -> None:
    """A mapping ``{series: {x: value}}`` at ``key`` as one line per series
    (``invert``: the mapping is ``{x: {series: value}}``).  ``select`` is a
    path into each series' mapping first (several, comma-separated: one panel
    each; several keys likewise), ``y`` a field of each value, ``scale`` a
    factor (1e6: seconds to µs)."""
    plt = _pyplot()
    keys = [k.strip() for k in key.split(",")]
    selects = [x.strip() for x in select.split(",")] if select else [None]
    panels = [(k, sel) for k in keys for sel in selects]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, (k, sel) in zip(axes.flat, panels):
        data = dig(snap["data"], k)
        if invert:
            flipped: dict = {}
            for xk, per in data.items():
                for series, v in per.items():
                    flipped.setdefault(series, {})[xk] = v
            data = flipped
        for series, per in data.items():
            if sel:
                try:
                    per = dig(per, sel)
                except ExtensionError:
                    continue
            pts = []
            for xk, v in per.items():
                v = v.get(y) if (y and isinstance(v, dict)) else v
                if _number(xk) is not None and isinstance(v, (int, float)):
                    pts.append((_number(xk), v * float(scale)))
            if pts:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                        label=series)
        _axes(ax, xlabel, ylabel, logx, logy,
              " ".join(x for x in (k.split(".")[-1] if len(keys) > 1 else "", sel or "") if x))
    _save(plt, fig, snap, path)


#: :kind: -> plotter(snapshot, png path, **options)
PLOTTERS = {"bench": plot_bench, "columns": plot_columns, "mapping": plot_mapping}


class ResultsPlot(Directive):
    required_arguments = 1
    option_spec = {"kind": directives.unchanged_required, "alt": directives.unchanged,
                   "key": directives.unchanged, "x": directives.unchanged,
                   "y": directives.unchanged,
                   "xlabel": directives.unchanged, "ylabel": directives.unchanged,
                   "select": directives.unchanged, "scale": directives.unchanged,
                   "invert": directives.flag}

    def run(self):
        name = self.arguments[0]
        snap = load(name)
        kind = self.options["kind"]
        if kind not in PLOTTERS:
            raise ExtensionError(f"unknown results-plot kind {kind!r}")
        env = self.state.document.settings.env
        out = os.path.join(env.srcdir, GENERATED)
        os.makedirs(out, exist_ok=True)
        tag = hashlib.sha1(repr(sorted(self.options.items())).encode()).hexdigest()[:8]
        fname = f"{name}-{kind}-{tag}.png"
        kw = {k: v for k, v in self.options.items() if k in ("key", "x", "y", "select",
                                                                 "scale", "xlabel", "ylabel")}
        if "invert" in self.options:
            kw["invert"] = True
        PLOTTERS[kind](snap, os.path.join(out, fname), **kw)
        env.note_dependency(snapshot.path(name))
        img = nodes.image(uri=f"/{GENERATED}/{fname}", alt=self.options.get("alt", name))
        return [img, stamp(name, snap)]


# ------------------------------------------------------------------ config

class ConfigVariables(Directive):
    """Every ``UCXPY_*`` variable, from the registry."""

    def run(self):
        from ucxpy.config import variables
        by_comp: dict = {}
        for var in sorted(variables().values(), key=lambda v: v.name):
            by_comp.setdefault(var.component, []).append(var)
        out = []
        for comp in sorted(by_comp, key=lambda c: (c != "core", c)):
            sec = nodes.rubric(text=f"{comp}")
            out.append(sec)
            rows = []
            for var in by_comp[comp]:
                default = "(secret)" if var.secret else repr(var.default)
                rows.append([var.name, default, " ".join(var.doc.split())])
            out.append(table(["variable", "default", "meaning"], rows))
        return out


def setup(app):
    app.add_directive("ucxpy-config", ConfigVariables)
    app.add_directive("results-table", ResultsTable)
    app.add_directive("results-plot", ResultsPlot)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
