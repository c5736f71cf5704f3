"""The package's layout: layers checked by import-linter, the top level, the plug-in group.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and ``.ci/run`` checks them
with ``lint-imports``; here they are also shown to fail, naming the import, when a copy of the
package is given a forbidden import.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from p2pdp.core import components

ROOT = Path(__file__).resolve().parents[2]
#: What the ``lint-imports`` command runs (the console script may not be on PATH).
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
PACKAGES = (
    "core",
    "privacy",
    "data",
    "learning",
    "protocols",
    "config",
    "sim",
    "net",
    "tasks",
    "experiments",
)


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the package found first under ``root`` (its pyproject's contracts)."""
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml") if root != ROOT else None
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layer_contracts_hold():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "named"),
    [
        (  # the engine importing the experiment layer
            "privacy/mechanisms.py",
            "import p2pdp.experiments.results.store",
            "Layers",
            "p2pdp.privacy.mechanisms -> p2pdp.experiments.results.store",
        ),
        (  # a scenario file's module importing the runner above it
            "experiments/scenarios/scenario.py",
            "import p2pdp.experiments.run.runner",
            "Experiments: each subpackage",
            "p2pdp.experiments.scenarios.scenario -> p2pdp.experiments.run.runner",
        ),
        (  # one workload importing another
            "tasks/pooled_testing/task.py",
            "import p2pdp.tasks.prevalence.estimators",
            "Workloads are independent",
            "p2pdp.tasks.pooled_testing.task -> p2pdp.tasks.prevalence.estimators",
        ),
        (  # the task framework importing a workload
            "tasks/pipeline.py",
            "import p2pdp.tasks.logistic.task",
            "The task framework",
            "p2pdp.tasks.pipeline -> p2pdp.tasks.logistic.task",
        ),
        (  # a cycle between two modules of one package
            "learning/models.py",
            "import p2pdp.learning.ensembles",
            "No import cycles",
            "No cycles are allowed in p2pdp.learning.\nIt could be made acyclic by removing 1 "
            "dependency:\n\n- .models -> .ensembles",
        ),
        (  # a cycle of imports for typing only: a sampler naming the world that imports it
            "sim/central.py",
            "if TYPE_CHECKING:\n    import p2pdp.sim.world",
            "No import cycles",
            "No cycles are allowed in p2pdp.sim.\nIt could be made acyclic by removing 1 "
            "dependency:\n\n- .central -> .world",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract_and_is_named(
    tmp_path, module, line, contract, named
):
    shutil.copytree(
        ROOT / "p2pdp", tmp_path / "p2pdp", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = tmp_path / "p2pdp" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    broken = done.stdout[done.stdout.index("Broken contracts") :]
    assert contract in broken and named in broken, done.stdout


def test_no_builtin_sampler_imports_the_world_that_builds_it_by_name():
    """The world resolves its sampler by name (``groups.sampler``, through the registry), so
    a sampler importing the world, even for typing only, closes a cycle that no import
    statement of the world shows: samplers see it through ``p2pdp.sim.sampler.SamplerWorld``."""
    graph = grimp.build_graph("p2pdp", cache_dir=None)  # TYPE_CHECKING imports counted
    samplers = {
        component["target"].split(":")[0]
        for component in components.listing()
        if component["kind"] == "sampler"
    }
    assert samplers == {"p2pdp.sim.central", "p2pdp.sim.gossip"}
    for module in sorted(samplers):
        chain = graph.find_shortest_chain(module, "p2pdp.sim.world", as_packages=True)
        assert chain is None, chain


def test_the_top_level_holds_only_the_packages_and_the_entry_points():
    top = {p.name for p in (ROOT / "p2pdp").iterdir() if p.name != "__pycache__"}
    entry_points = {"__init__.py", "results.py", "py.typed"}
    assert top == entry_points | set(PACKAGES)


def test_an_installed_package_registers_a_component_through_the_entry_point_group(tmp_path):
    """The group name is public (plug-ins write it in their pyproject.toml): never moves."""
    info = tmp_path / "my_noise-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-noise\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[p2pdp.components]\nmechanism.my-noise = p2pdp.privacy.mechanisms:Gaussian\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "p2pdp.experiments.cli", "components", "mechanism"],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert any(line.split()[:1] == ["my-noise"] for line in done.stdout.splitlines()), done.stdout


@pytest.mark.parametrize(
    ("package", "name", "home"),
    [
        ("report", "write_report", "report.write"),
        ("results", "ResultsStore", "results.store"),
        ("audit", "run_audit", "audit.table"),
        ("network", "run_hosts", "network.processes"),
        # each also imported by a module found before the one that defines it
        ("network", "RunHosts", "network.processes"),  # a class, imported by launch
        ("results", "ColumnTable", "results.tables"),  # imported by store
        ("audit", "one_run_result", "audit.iterative"),  # a function, imported by correlated
        ("audit", "AUDIT_CANARIES", "audit.iterative"),  # a constant, likewise
    ],
)
def test_a_name_of_a_module_that_became_a_package_says_where_it_went(package, name, home):
    """0.3 made four modules of p2pdp.experiments packages of the same name: their old names
    are not forwarded, but importing one names the module that defines it (not one that only
    imports it from there) instead of "cannot import"."""
    module = importlib.import_module(f"p2pdp.experiments.{package}")
    with pytest.raises(ImportError, match=rf"it is p2pdp\.experiments\.{home}\.{name} "):
        getattr(module, name)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018
