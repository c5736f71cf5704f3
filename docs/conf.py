"""Sphinx configuration of the p2pdp documentation: the user guide and the API reference.

Build (warnings are errors, as ``tests/project/test_docs.py`` and CI do)::

    sphinx-build -W --keep-going -b html docs docs/_build

The guide (``guide/``) is Markdown, read by myst-parser. Every module of the package gets its
own API page, generated here from the package itself (``api/modules/``, not committed), so a
new module is documented without editing this directory.
``protocols.rst`` documents every protocol a user implements, through the ``p2pdp-protocol``
directive defined below.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # document this checkout, not another installed copy

import p2pdp  # noqa: E402

project = "p2pdp"
author = "p2pdp developers"
copyright = "p2pdp developers"
release = version = p2pdp.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.intersphinx"]
exclude_patterns = ["_build", "api/_build"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# Headings get anchors, so the guide's pages link to each other's sections (page.md#section).
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]
html_theme = "alabaster"
html_static_path: list[str] = []

# numpy-style docstrings; "Attributes" sections become :ivar: fields, so that dataclass fields
# are not described twice (once by napoleon, once by autodoc).
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
# The docstrings give types with shapes and units; signatures keep the annotations short.
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_type_aliases = {"ArrayLike": "ArrayLike", "NDArray": "NDArray"}

# Links into the Python docs resolve offline-safe: no inventories are fetched (the build must
# not need the network); references to outside objects simply render as text.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

# ---------------------------------------------------------------------------------------------
# One page per module
# ---------------------------------------------------------------------------------------------

MODULES_DIR = HERE / "api" / "modules"


def package_modules() -> list[str]:
    """Every public module and subpackage of p2pdp, sorted (names starting with ``_`` skipped)."""
    names = ["p2pdp"]
    for info in pkgutil.walk_packages(p2pdp.__path__, prefix="p2pdp."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def write_module_pages() -> None:
    """(Re)write ``modules/<module>.rst`` for every module; remove pages of vanished modules."""
    MODULES_DIR.mkdir(exist_ok=True)
    wanted = {f"{name}.rst": name for name in package_modules()}
    for stale in MODULES_DIR.glob("*.rst"):
        if stale.name not in wanted:
            stale.unlink()
    for filename, name in wanted.items():
        text = f"{name}\n{'=' * len(name)}\n\n.. automodule:: {name}\n"
        page = MODULES_DIR / filename
        if not page.exists() or page.read_text() != text:  # unchanged pages keep their mtime
            page.write_text(text)


write_module_pages()

# ---------------------------------------------------------------------------------------------
# Protocols a user implements
# ---------------------------------------------------------------------------------------------

#: Protocols listed in protocols.rst that do not exist yet (the engine refactor adds them).
#: Each is rendered as a visible "not implemented yet" note instead of failing the build. An
#: entry that exists fails the build until it is removed here; anything missing that is *not*
#: listed fails the build too (autodoc cannot import it). Empty this set when they all exist.
PENDING_PROTOCOLS: frozenset[str] = frozenset({})

logger = logging.getLogger(__name__)


def importable(target: str) -> bool:
    """Whether ``package.module.Name`` imports."""
    module_name, _, attribute = target.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return False
    return hasattr(module, attribute)


class ProtocolDirective(SphinxDirective):
    """``.. p2pdp-protocol:: package.module.Name``: the protocol's class documentation.

    Renders ``autoclass`` with every member (documented or not), without a second index entry
    (the module page holds the canonical one).
    """

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        target = self.arguments[0]
        if target in PENDING_PROTOCOLS:
            if importable(target):
                logger.warning(
                    "%s exists now: remove it from PENDING_PROTOCOLS in docs/conf.py",
                    target,
                    location=self.get_location(),
                )
            else:
                note = nodes.warning()
                note += nodes.paragraph(text=f"{target}: not implemented yet.")
                return [note]
        text = (
            f".. autoclass:: {target}\n"
            "   :members:\n"
            "   :undoc-members:\n"
            "   :special-members: __call__\n"
            "   :no-index:\n"
        )
        return self.parse_text_to_nodes(text)


_ALIAS_REPR = re.compile(r"TypeAliasForwardRef\('([\w.]+)'\)")


def tidy_signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: object,
    options: object,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None]:
    """Show a type alias nested in a generic (``Sequence[ArrayLike]``) by its name, and a
    ``typing.Protocol`` without the meaningless ``(*args, **kwargs)`` of its constructor.

    autodoc renders such an alias as ``TypeAliasForwardRef('numpy.typing.ArrayLike')``.
    """
    if what == "class" and getattr(obj, "_is_protocol", False):
        return "", return_annotation

    def tidy(text: str | None) -> str | None:
        return None if text is None else _ALIAS_REPR.sub(r"\1", text)

    return tidy(signature), tidy(return_annotation)


def skip_named_tuple_fields(
    app: Sphinx, what: str, name: str, obj: object, skip: bool, options: object
) -> bool | None:
    """Leave out a ``NamedTuple``'s field accessors ("Alias for field number N"): the class's
    "Attributes" section describes its fields (as ``:ivar:``, like a dataclass's), and a
    second entry per field would make names like ``epsilon`` ambiguous targets."""
    return True if type(obj).__name__ == "_tuplegetter" else None


def setup(app: Sphinx) -> dict[str, bool]:
    app.add_directive("p2pdp-protocol", ProtocolDirective)
    app.connect("autodoc-process-signature", tidy_signature)
    app.connect("autodoc-skip-member", skip_named_tuple_fields)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
