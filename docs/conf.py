"""Sphinx configuration of ucxpy's documentation (``make docs``).

The build is offline and strict: ``make docs`` runs ``sphinx-build -W -n``
(warnings are errors, every reference must resolve), and ``make test`` runs
the same build (tests/test_docs.py).  Python's own names resolve through the
inventory of Debian's ``python3.11-doc`` (``make deps`` installs it); nothing
is fetched.  Third-party names (numpy, torch, mpi4py) are ignored by the one
list below.
"""
import os
import re
import sys
import typing

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(HERE, "_ext"))

project = "ucxpy"
author = "the ucxpy developers"
copyright = "2026, the ucxpy developers"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "ucxpy_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "results", "examples"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

nitpicky = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
# public members without a docstring are listed too, with their signature
# (what {"undoc-members": False} also did: autodoc takes any value as the flag)
autodoc_default_options = {"undoc-members": True}
autodoc_preserve_defaults = True      # defaults as written (FULL_MASK), not their values

# Python's inventory from the local python3.11-doc package; never the network
PYTHON_INV = "/usr/share/doc/python3.11/html/objects.inv"
intersphinx_mapping = {}
if os.path.exists(PYTHON_INV):
    intersphinx_mapping["python"] = ("https://docs.python.org/3.11", PYTHON_INV)
# (only Python's objects: a page's {doc} or label never resolves into Python's docs)
intersphinx_disabled_reftypes = ["std:*"]

# The one list of names this build does not resolve: third-party packages
# (no inventory is fetched) and, without python3.11-doc, Python's builtins.
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|torch|mpi4py|c10d)(\.|::).*"),
    (r"py:.*", r"(numpy\.)?ndarray"),
]
if "python" not in intersphinx_mapping:
    nitpick_ignore_regex.append((r"py:.*", r"(int|str|bytes|float|bool|dict|list|tuple|"
                                           r"object|memoryview|bytearray|callable|"
                                           r"Callable|Optional|Iterable|Sequence|"
                                           r"Exception|.*Error)"))

html_theme = "alabaster"
html_static_path = []
html_title = "ucxpy"


# -- autodoc: a docstring's own section titles ("Theory of operation",
# underlined) become rubrics, so that the API pages keep their own sections
# (and two modules' titles are not two targets of one name)
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")


def _titles_as_rubrics(app, what, name, obj, options, lines):
    for i in range(len(lines) - 1):
        title, under = lines[i], lines[i + 1]
        if (title.strip() and not title[0].isspace() and _UNDERLINE.match(under)
                and len(under.strip()) >= len(title.strip())
                and (i == 0 or not lines[i - 1].strip())):
            lines[i], lines[i + 1] = f".. rubric:: {title.strip()}", ""


# -- autodoc: a type hint that cannot be evaluated (the modules import typing
# for type checkers only) reaches the page as written; a forward reference in
# quotes ('Team') names that class, and a typing name imported under a
# private alias (_Optional) is typing's
def _unevaluated_hints(app, env, node, contnode):
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py":
        return None
    if target[:1] == "_" and target[1:] in typing.__all__:
        return contnode
    if len(target) > 2 and target[0] == target[-1] and target[0] in "'\"":
        ref = node.deepcopy()
        ref["reftarget"] = target[1:-1]
        return env.domains["py"].resolve_xref(env, node["refdoc"], app.builder,
                                              node["reftype"], target[1:-1], ref, contnode)
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _titles_as_rubrics)
    app.connect("missing-reference", _unevaluated_hints)
