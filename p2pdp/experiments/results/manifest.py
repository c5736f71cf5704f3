"""What a results folder's ``manifest.json`` records (:mod:`p2pdp.experiments.results.store`):
the scenario, what its cells depend on, the versions; the checks a resumed run must pass
against it, and the command that finishes its run.
"""

from __future__ import annotations

import platform
import shlex
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.results.files import CELL_SELECTION, RESULTS_FILE
from p2pdp.experiments.scenarios.scenario import (
    Scenario,
    format_change,
    parse_scenario,
    scenario_changes,
)

_VERSIONED = ("p2pdp", "numpy", "scipy", "simpy", "scikit-learn", "networkx", "matplotlib")


def run_inputs(scenario: Scenario, *, read_data: bool = True) -> dict[str, Any]:
    """What a scenario's cells depend on besides its settings: p2pdp's version, the data.

    ``{"p2pdp": version, "data": {file: sha256}}`` over the data files of every grid point
    (:func:`p2pdp.data.loaders.data_fingerprint`) and of every ``partition.path``. Recorded in
    the manifest; ``--resume`` refuses a folder whose inputs differ, so it never merges results
    of two data sets or versions. ``read_data`` false: no file is opened and ``data`` is
    empty (a network run whose coordinator holds no data: it cannot tell whether the hosts'
    shard files changed; a resume of a folder whose cells fingerprinted their data is refused).
    """
    from p2pdp.data.loaders import data_fingerprint, file_fingerprint

    data: dict[str, str] = {}
    if not read_data:
        return {"p2pdp": _version("p2pdp"), "data": data}
    for config in {point.config.data for point in scenario.points}:
        data.update(data_fingerprint(config))
    data.update(
        file_fingerprint({point.config.partition.path or "" for point in scenario.points} - {""})
    )
    return {"p2pdp": _version("p2pdp"), "data": dict(sorted(data.items()))}


def _scenario_change(
    directory: Path,
    manifest: dict[str, Any],
    scenario: Scenario,
    cell_ids: Sequence[str] | None,
    *,
    resume: bool,
) -> dict[str, Any] | None:
    """Whether ``scenario`` may write the folder of ``manifest`` (which holds results):
    ``None`` if it is the folder's scenario and ``resume`` is set; the change to record if it
    only adds folds (:data:`CELL_SELECTION`) and ``resume`` is set; else ConfigError saying
    what changed."""
    retry = "use another --out, or --force to discard them"
    if manifest["scenario_hash"] == scenario.digest:
        if resume:
            return None
        raise ConfigError(
            f"--out {directory} already holds results of this scenario; use --resume to "
            "finish it, or --force to discard them"
        )
    what = (
        f"--out {directory} already holds results of a different scenario "
        f"({manifest['scenario']!r} from {manifest['scenario_source']}, hash "
        f"{manifest['scenario_hash'][:12]}, not {scenario.digest[:12]})"
    )
    try:
        before = parse_scenario(
            manifest["scenario_text"],
            source=manifest["scenario_source"],
            overrides=manifest.get("overrides", []),
            unset=manifest.get("unset", []),
        )
    except (ConfigError, KeyError, TypeError):
        before = None  # written from a mapping, or by a p2pdp that read it otherwise
    changes = [] if before is None else scenario_changes(before, scenario)
    if before is None or before.digest != manifest["scenario_hash"] or not changes:
        raise ConfigError(f"{what}; {retry}")
    text = "; ".join(map(format_change, changes))
    if any(key != CELL_SELECTION for key, _, _ in changes):
        only = f"; --resume can only add folds ({CELL_SELECTION})" if resume else ""
        raise ConfigError(f"{what}: {text}{only}; {retry}")
    left_out = sorted(set(manifest.get("cell_ids") or ()) - set(cell_ids or ()))
    if left_out or cell_ids is None:
        folds = set(before.config.evaluation.fold_indices())
        gone = sorted(folds - set(scenario.config.evaluation.fold_indices()))
        why = (
            f"the folder holds cells of folds {gone} that it leaves out"
            if gone
            else f"its cell ids differ (first old one missing: {left_out[0]}: a fold number "
            "with more digits renames every cell)"
            if left_out
            else "no grid to check the folder against"
        )
        raise ConfigError(f"--out {directory}: {text}: {why}; --resume can only add folds; {retry}")
    if not resume:
        raise ConfigError(
            f"--out {directory} already holds results of this scenario with fewer folds "
            f"({text}); use --resume to run the new folds' cells, or --force to discard them"
        )
    return {
        "change": text,
        "scenario_hash": manifest["scenario_hash"],
        "overrides": manifest.get("overrides", []),
        "unset": manifest.get("unset", []),
        "cells": manifest.get("cells"),
    }


def _check_inputs(directory: Path, manifest: dict[str, Any], inputs: dict[str, Any]) -> None:
    old = manifest.get("inputs")
    if old == inputs:
        return
    if old is None:
        changes = ["the folder does not record them (written by an older p2pdp)"]
    else:
        changes = []
        if old.get("p2pdp") != inputs["p2pdp"]:
            changes.append(f"p2pdp {old.get('p2pdp')} -> {inputs['p2pdp']}")
        before, now = old.get("data", {}), inputs["data"]
        for name in sorted(before.keys() | now.keys()):
            if before.get(name) != now.get(name):
                was, new = (d.get(name, "absent")[:12] for d in (before, now))
                changes.append(f"{name} sha256 {was} -> {new}")
    raise ConfigError(
        f"--out {directory}: what its cells depend on changed since they ran: "
        f"{'; '.join(changes)}; resuming would mix results of both; use --force to start over, "
        "or another --out"
    )


def _check_cell_ids(directory: Path, manifest: dict[str, Any], done: frozenset[str]) -> None:
    """ConfigError if ``results.csv`` holds a cell outside the manifest's grid."""
    known = manifest.get("cell_ids")
    if known is None:  # written before the manifest listed them
        return
    unknown = sorted(done - set(known))
    if unknown:
        raise ConfigError(
            f"{directory / RESULTS_FILE}: {len(unknown)} row(s) of cells outside the scenario's "
            f"grid (first: {unknown[0]}): the file was edited or mixed with another run's; "
            "use --force to start over"
        )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def resume_command(directory: str | Path, manifest: dict[str, Any]) -> str:
    """The command that finishes the run of ``manifest`` in ``directory``: its scenario,
    ``--unset`` keys, ``--set`` overrides, and for a network run ``--runtime network`` and its
    ``--hosts``."""
    words = ["p2pdp", "run", str(manifest.get("scenario_source", "SCENARIO"))]
    words += ["--out", str(directory)]
    words += [word for key in manifest.get("unset", []) for word in ("--unset", key)]
    words += [word for override in manifest.get("overrides", []) for word in ("--set", override)]
    runtime = manifest.get("runtime", "simulation")
    if runtime != "simulation":
        words += ["--runtime", runtime]
    if manifest.get("hosts"):
        words += ["--hosts", str(manifest["hosts"])]
    return shlex.join([*words, "--resume"])


def _scenario_fields(scenario: Scenario) -> dict[str, Any]:
    """What a manifest says about its scenario."""
    return {
        "scenario": scenario.name,
        "scenario_source": scenario.source,
        "scenario_hash": scenario.digest,
        "scenario_text": scenario.text,
        "overrides": list(scenario.overrides),
        "unset": list(scenario.unset),
        "sweep": [
            {"keys": list(a.keys), "values": [list(v) for v in a.values]} for a in scenario.axes
        ],
    }


def _new_manifest(
    scenario: Scenario, n_cells: int, cell_ids: Sequence[str] | None, inputs: dict[str, Any]
) -> dict[str, Any]:
    versions = {package: _version(package) for package in _VERSIONED}
    return {
        **_scenario_fields(scenario),
        "cells": n_cells,
        "cell_ids": None if cell_ids is None else list(cell_ids),
        "inputs": inputs,
        "tables": [],
        "versions": versions,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "started": _now(),
        "finished": None,
    }


def _git_commit() -> str | None:
    """HEAD of the repository p2pdp is installed from, or None (not a checkout, no git)."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
