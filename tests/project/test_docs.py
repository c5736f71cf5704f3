"""The documentation builds cleanly: the user guide, and an API reference that covers every
module and protocol; the README stays short and every relative link resolves.

Sphinx is in the ``test`` extra, so a missing Sphinx fails these tests instead of skipping them.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import p2pdp
import p2pdp.core.components

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"  # the Sphinx project: the user guide and the API reference (api/)


def _modules() -> list[str]:
    names = ["p2pdp"]
    for info in pkgutil.walk_packages(p2pdp.__path__, prefix="p2pdp."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML reference, built with warnings as errors; fails with Sphinx's own report."""
    assert importlib.util.find_spec("sphinx") is not None, (
        "Sphinx is not installed: pip install -e '.[test]'"
    )
    out = tmp_path_factory.mktemp("api-html")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html"]
    command += ["-d", str(out / ".doctrees"), str(DOCS), str(out)]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_every_module_has_a_page_with_its_docstring(html: Path) -> None:
    for name in _modules():
        page = html / "api" / "modules" / f"{name}.html"
        assert page.is_file(), f"no API page for {name}"
        text = page.read_text()
        assert f'id="module-{name}"' in text, f"{page.name} does not document module {name}"
        summary = (importlib.import_module(name).__doc__ or "").strip().split("\n")[0]
        assert summary, f"module {name} has no docstring"
        plain = re.sub(r"<[^>]+>", "", text)
        words = re.findall(r"[A-Za-z]{4,}", re.sub(r":[\w:]+:`", "`", summary))
        for word in words[:4]:
            assert word in plain, f"{name}: docstring summary missing from its page"


def _documented_protocols() -> list[str]:
    """The protocol classes that :mod:`p2pdp.core.components` names for the kinds, in order."""
    return re.findall(r":class:`(p2pdp\.[\w.]+)`", p2pdp.core.components.__doc__ or "")


def test_protocols_page_lists_the_protocol_of_every_kind() -> None:
    protocols = _documented_protocols()
    assert len(protocols) == len(p2pdp.core.components.KINDS)
    page = (DOCS / "api" / "protocols.rst").read_text()
    listed = re.findall(r"^\.\. p2pdp-protocol:: (\S+)$", page, flags=re.MULTILINE)
    assert listed == protocols
    assert ".. automodule:: p2pdp.core.components" in page


def test_protocols_page_documents_each_protocol_or_marks_it_missing(html: Path) -> None:
    text = re.sub(r"<[^>]+>", "", (html / "api" / "protocols.html").read_text())
    for target in _documented_protocols():
        module, _, name = target.rpartition(".")
        try:
            exists = hasattr(importlib.import_module(module), name)
        except ImportError:
            exists = False
        if exists:
            assert f"class {target}" in text, target
            assert f"{target}: not implemented yet" not in text
        else:
            assert f"{target}: not implemented yet." in text, target


def test_package_ships_its_py_typed_marker() -> None:
    assert (resources.files("p2pdp") / "py.typed").is_file()


def test_the_guide_builds_with_every_page(html: Path) -> None:
    from tests.docs_pages import GUIDE, guide_pages

    for path in guide_pages():
        built = html / "guide" / path.relative_to(GUIDE).with_suffix(".html")
        assert built.is_file(), f"{path.name} is not in the guide's table of contents"


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move detail into docs/guide/"


def test_every_relative_link_resolves() -> None:
    from tests.docs_pages import README, guide_pages

    for path in [README, *guide_pages()]:
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = (path.parent / target.split("#")[0]).resolve()
            assert file.exists(), f"{path.relative_to(ROOT)} links {target}, which does not exist"
