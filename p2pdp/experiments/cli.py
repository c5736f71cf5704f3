"""Command-line interface: ``p2pdp datasets|audit|run|split|report|components``.

Each sub-command lives in its own ``_add_<name>`` / ``_cmd_<name>`` pair below; the heavy
lifting is in the package modules, the CLI only parses, calls and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from p2pdp import __version__
from p2pdp.core.errors import ClusterLostError, ConfigError, P2PDPError


# --- datasets ---------------------------------------------------------------------------------
def _add_datasets(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp datasets list|info|fetch`` (owned by the datasets module's author)."""
    parser = subparsers.add_parser(
        "datasets",
        help="list, inspect and download the benchmark data sets",
        description="Data files are searched in --path, $P2PDP_DATA_HOME, then the user cache "
        "($XDG_CACHE_HOME/p2pdp or ~/.cache/p2pdp), where `fetch` downloads them.",
    )
    # ACTION is checked by the command, not by argparse: argparse reports a missing required
    # argument before an unknown option (`p2pdp datasets --bogus` said "ACTION is required")
    actions = parser.add_subparsers(dest="datasets_action", metavar="ACTION")
    parser.set_defaults(func=lambda args: parser.error("give an ACTION: list, info or fetch"))
    actions.add_parser("list", help="the data sets and their shapes").set_defaults(
        func=_cmd_datasets_list
    )
    info = actions.add_parser("info", help="rows, features, classes and where the files are")
    info.add_argument("name", help="data set name (see `p2pdp datasets list`)")
    info.add_argument("--json", action="store_true", help="print a JSON object")
    info.add_argument("--path", help="a data file, or a directory holding the files (first)")
    info.set_defaults(func=_cmd_datasets_info)
    fetch = actions.add_parser("fetch", help="download into the user cache, checking sha256")
    which = fetch.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?", help="data set name")
    which.add_argument("--all", action="store_true", help="fetch every data set")
    fetch.add_argument("--force", action="store_true", help="download even if already cached")
    fetch.set_defaults(func=_cmd_datasets_fetch)


def _cmd_datasets_list(args: argparse.Namespace) -> int:
    from p2pdp.data.manifests import available_datasets, load_manifest

    print(f"{'name':<12} {'rows':<15} {'features':>8}  title")
    for name in available_datasets():
        manifest = load_manifest(name)
        rows = " + ".join(str(spec.rows) for spec in manifest.files)
        print(f"{name:<12} {rows:<15} {manifest.n_features:>8}  {manifest.title}")
    return 0


def _cmd_datasets_info(args: argparse.Namespace) -> int:
    import json

    from p2pdp.data.benchmarks import dataset_info

    info = dataset_info(args.name, path=args.path)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    bounds = "data-independent, from the manifest" if info["feature_bounds"] else "none known"
    print(f"{info['name']}: {info['title']}")
    print(f"  features  {info['features']} (bounds: {bounds})")
    for label, prefix in (("train", ""), ("test", "test_")):
        if info[f"{prefix}rows"] is not None:
            print(
                f"  {label:<8}  {info[f'{prefix}rows']} rows, {info[f'{prefix}positives']} "
                f"positive, {info[f'{prefix}negatives']} negative"
            )
    for file in info["files"]:
        check = {True: "sha256 ok", False: "sha256 MISMATCH", None: "sha256 not checked"}
        print(f"  file      {file['path']} ({file['origin']}, {check[file['sha256_ok']]})")
    return 0


def _cmd_datasets_fetch(args: argparse.Namespace) -> int:
    from p2pdp.data.benchmarks import fetch_dataset
    from p2pdp.data.manifests import available_datasets

    for name in available_datasets() if args.all else [args.name]:
        for path in fetch_dataset(name, force=args.force):
            print(f"{name}: {path}")
    return 0


# --- audit ------------------------------------------------------------------------------------
def _add_audit(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp audit`` (owned by the privacy-core author)."""
    parser = subparsers.add_parser(
        "audit",
        help="empirically lower-bound the epsilon of each privacy mechanism",
        description="Threshold-test audit (Clopper-Pearson, 95%%) of the additive-noise "
        "mechanisms in d = 58 at epsilon = 1, exact epsilon of randomized response (keep and "
        "two-coin forms) and the noisy count, and of one member of a pooled test "
        "against its claimed epsilon, with the other members unknown to the adversary. "
        "seed-laplace, vector-laplace-exponential-norm and pooled-test-known-others (pooling "
        "is not worst-case DP) are negative controls that must fail. Then the posterior-"
        "sampling audits: the exponential mechanism's exact epsilon on a grid of neighbouring "
        "data sets (linear and logistic; a half-sensitivity negative control) and a KS test of "
        "the Langevin sampler's stationary law (a wrong-noise negative control). Then whole "
        "runs of dpsgd, muffliato and gossip-learning: canaries in one peer's shard, guessed by "
        "a neighbour from the models it receives, turned into an epsilon lower bound by the "
        "one-run audit against the peer's epsilon_spent (95%%): the f-DP bound of Mahloujifar, "
        "Melis & Chaudhuri 2024 for the mu-GDP claims of full sampling (10^6 canaries), the "
        "(epsilon, delta) bound of Steinke, Nasr & Jagielski 2023 for Poisson sampling "
        "(dpsgd-poisson); the -unclipped, -half-noise and -inverted-sampling rows are negative "
        "controls. Then D-PSGD with correlated noise against an eavesdropper and a curious "
        "neighbour, each claim the exact epsilon of that threat model; -reused-pairs, "
        "-weighted-pairs and -leaked-secret are negative controls (~6 minutes in all). Exit "
        "status 1 if any outcome differs from its expectation.",
    )
    parser.add_argument(
        "--mechanism", help="audit only this one (default: all; see the table for the names)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects")
    parser.add_argument(
        "--samples", type=int, default=100_000, help="outputs per side (default: 100000)"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="runs pooled by each iterative protocol's audit, 500 canaries each (default: 2000 "
        "for the honest rows of a mu-GDP claim, 100 for the others)",
    )
    parser.add_argument(
        "--seed", type=_integer(0), default=0, help="root random seed, >= 0 (default: 0)"
    )
    parser.set_defaults(func=_cmd_audit)


def _cmd_audit(args: argparse.Namespace) -> int:
    import json

    _check_audit_arguments(args)
    from p2pdp.experiments.audit.correlated import CORRELATED_AUDIT_NAMES, run_correlated_audit
    from p2pdp.experiments.audit.iterative import ITERATIVE_AUDIT_NAMES, run_iterative_audit
    from p2pdp.experiments.audit.table import AUDIT_NAMES, format_audit_table, run_audit
    from p2pdp.privacy.posterior_sampling.audit import POSTERIOR_AUDIT_NAMES, run_posterior_audit

    # then the posterior audits (exact and Langevin, ~3 s), whole iterative runs (~5 min)
    # and correlated D-PSGD per threat model (~1 min)
    correlated: tuple[str, ...] = ()
    if args.mechanism is None:
        names, posterior, iterative = AUDIT_NAMES, POSTERIOR_AUDIT_NAMES, ITERATIVE_AUDIT_NAMES
        correlated = CORRELATED_AUDIT_NAMES
    elif args.mechanism in CORRELATED_AUDIT_NAMES:
        names, posterior, iterative, correlated = (), (), (), (args.mechanism,)
    elif args.mechanism in POSTERIOR_AUDIT_NAMES:
        names, posterior, iterative = (), (args.mechanism,), ()
    elif args.mechanism in ITERATIVE_AUDIT_NAMES:
        names, posterior, iterative = (), (), (args.mechanism,)
    else:
        names, posterior, iterative = (args.mechanism,), (), ()

    def additive(name: str) -> list:
        return run_audit((name,), n_samples=args.samples, seed=args.seed)

    def exact(name: str) -> list:
        return run_posterior_audit((name,), seed=args.seed)

    def whole_runs(name: str) -> list:
        return run_iterative_audit((name,), seed=args.seed, runs=args.runs)

    def correlated_runs(name: str) -> list:
        if args.runs is None:  # its own default (--runs sets every whole-run audit's)
            return run_correlated_audit((name,), seed=args.seed)
        return run_correlated_audit((name,), seed=args.seed, runs=args.runs)

    # one at a time (each on its own stream: the same results), saying which one starts
    planned = [
        *((name, additive) for name in names),
        *((name, exact) for name in posterior),
        *((name, whole_runs) for name in iterative),
        *((name, correlated_runs) for name in correlated),
    ]
    results = []
    for number, (name, audit) in enumerate(planned, 1):
        print(f"p2pdp audit: [{number}/{len(planned)}] {name}", file=sys.stderr, flush=True)
        results += audit(name)
    if args.json:
        print(json.dumps([result.as_dict() for result in results], indent=2))
    else:
        print(format_audit_table(results))
    return 0 if all(result.as_expected for result in results) else 1


def _check_audit_arguments(args: argparse.Namespace) -> None:
    """ConfigError naming ``--mechanism``, ``--samples`` or ``--runs`` if it cannot run."""
    from p2pdp.experiments.audit.correlated import CORRELATED_AUDIT_NAMES
    from p2pdp.experiments.audit.iterative import ITERATIVE_AUDIT_NAMES
    from p2pdp.experiments.audit.table import AUDIT_NAMES
    from p2pdp.privacy.audit import MIN_AUDIT_SAMPLES
    from p2pdp.privacy.posterior_sampling.audit import POSTERIOR_AUDIT_NAMES

    every = (*AUDIT_NAMES, *POSTERIOR_AUDIT_NAMES, *ITERATIVE_AUDIT_NAMES, *CORRELATED_AUDIT_NAMES)
    if args.mechanism is not None and args.mechanism not in every:
        raise ConfigError(f"--mechanism must be one of {', '.join(every)}; got {args.mechanism!r}")
    if args.samples < MIN_AUDIT_SAMPLES:
        raise ConfigError(
            f"--samples must be an integer >= {MIN_AUDIT_SAMPLES}, got {args.samples}"
        )
    if args.runs is not None and args.runs < 1:
        raise ConfigError(f"--runs must be an integer >= 1, got {args.runs}")


# --- run / report -------------------------------------------------------------------------------
def _add_run(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp run`` (owned by the experiment module's author)."""
    parser = subparsers.add_parser(
        "run",
        help="run a scenario's sweep (folds x grid x repetitions) and write a report",
        description="Cells sharing a local training run together; each cell's row is "
        "appended to OUT/results.csv as soon as it finishes, so an interrupted run (Ctrl-C, "
        "SIGTERM: exit status 130, 143) can be finished with --resume. One process writes a "
        "folder at a time. OUT/report.md and figures are written at the end.",
    )
    parser.add_argument("scenario", help="a scenario TOML file, or a shipped scenario's name")
    parser.add_argument("--out", help="results folder (default: results/<scenario name>)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='override a setting, e.g. groups.group_size=20 or sweep."privacy.epsilon"=[1,10] '
        "(repeatable; a plain setting also removes that key from the sweep)",
    )
    _add_unset(parser)
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--jobs",
        type=int,
        help="local worker processes (default: all cores; 1 = in-process); a single task "
        "uses them for its local models",
    )
    where.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://host:8786")
    parser.add_argument(
        "--runtime",
        choices=("simulation", "network"),
        default="simulation",
        help="simulation (SimPy, default) or network: the peers run as OS processes on this "
        "machine (or where --hosts says) exchanging real messages over TCP (one-shot protocol "
        "with the central or gossip sampler, and the iterative protocols)",
    )
    parser.add_argument(
        "--hosts",
        metavar="N|FILE",
        help="with --runtime network: how many host processes run on this machine (an "
        "integer, at most partition.n_peers), or a hosts file saying where they run and how "
        "to start them (e.g. over ssh; see the network guide); default: this machine, one "
        "per core (P2PDP_NETWORK_HOSTS)",
    )
    keep = parser.add_mutually_exclusive_group()  # --force would silently win over --resume
    keep.add_argument(
        "--resume", action="store_true", help="finish an interrupted run of the same scenario"
    )
    keep.add_argument("--force", action="store_true", help="discard results already in the folder")
    parser.set_defaults(func=_cmd_run)


def _add_unset(parser: argparse.ArgumentParser) -> None:
    """The ``--unset KEY`` option of the commands that load a scenario."""
    parser.add_argument(
        "--unset",
        action="append",
        default=[],
        metavar="KEY",
        help="drop a setting the scenario file sets (in its table or its sweep), so that its "
        "default applies, e.g. groups.group_size (repeatable; applied before every --set)",
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from p2pdp.experiments.scenarios.scenario import load_scenario

    # validated before the runner and the report load scipy, scikit-learn, matplotlib, dask
    scenario = load_scenario(args.scenario, args.overrides, args.unset)
    from p2pdp.experiments.report.write import write_report
    from p2pdp.experiments.run.runner import default_out_dir, run_experiment
    from p2pdp.experiments.scenarios.disclosure import mechanism_warnings

    for key in scenario.unread_axes:
        print(
            f"p2pdp: note: {key} is swept, but no cell's components read it: its values give "
            f"the same cells, run once ({len(scenario.points)} grid points in all)",
            file=sys.stderr,
        )
    for reason in scenario.dropped:  # "KEY = VALUE is read only with ..."
        print(
            f"p2pdp: note: {reason}: dropped, its default applies (--unset "
            f"{reason.partition(' = ')[0]} drops it without this note)",
            file=sys.stderr,
        )
    hosts: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if args.hosts is not None:
        if args.runtime != "network":
            raise ConfigError("--hosts needs --runtime network")
        # checked with each grid point's peer count before anything runs
        from p2pdp.experiments.network.hosts_file import hosts_given

        hosts = hosts_given(args.hosts)
    for warning in mechanism_warnings(point.config for point in scenario.points):
        print(f"p2pdp: warning: {warning}", file=sys.stderr)
    out = args.out or default_out_dir(scenario)
    with hosts, _signals_interrupt():
        try:
            summary = run_experiment(
                scenario,
                out,
                jobs=args.jobs,
                scheduler=args.scheduler,
                resume=args.resume,
                force=args.force,
                progress=sys.stderr,
                runtime=args.runtime,
            )
        except KeyboardInterrupt as exc:
            from p2pdp.experiments.network.hosts_file import hosts_flag
            from p2pdp.experiments.results.manifest import resume_command

            name, code = _signal_of(exc)
            network = args.runtime == "network"
            again = resume_command(
                out,
                {
                    "scenario_source": args.scenario,
                    "overrides": args.overrides,
                    "unset": args.unset,
                    "runtime": args.runtime,
                    "hosts": hosts_flag() if network else None,  # --hosts, or the environment
                },
            )
            print(
                f"\np2pdp: interrupted by {name}; workers stopped, finished cells kept in "
                f"{out}; finish with: {again}",
                file=sys.stderr,
            )
            return code
        except ClusterLostError as exc:
            from p2pdp.experiments.results.files import read_manifest
            from p2pdp.experiments.results.manifest import resume_command

            again = resume_command(out, read_manifest(out))
            raise ClusterLostError(f"{exc} in {out}; finish with: {again}") from None
        except OSError as exc:
            raise _os_error(exc) from None
        print(
            f"{summary.cells} cells ({summary.run} run, {summary.skipped} already done) in "
            f"{summary.seconds:.1f} s; results in {summary.directory}"
        )
        return _report(write_report, summary.directory)


def _report(write_report: Callable[[Path], Path], directory: Path) -> int:
    """Write the report of ``directory``: 0, or 128 + signal number if interrupted."""
    try:
        print(f"report: {write_report(directory)}")
    except KeyboardInterrupt as exc:
        name, code = _signal_of(exc)
        print(
            f"\np2pdp: report interrupted by {name} (files already written are complete); "
            f"write it with: p2pdp report {directory}",
            file=sys.stderr,
        )
        return code
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _os_error(exc) from None
    return 0


#: Signals that stop `run` and `report` the way Ctrl-C does; exit status 128 + number.
_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into ``KeyboardInterrupt(signal name)`` meanwhile.

    So a ``kill`` stops the workers, marks the results folder ``interrupted`` and leaves it
    resumable, exactly like Ctrl-C.
    """

    def interrupt(number: int, frame: object) -> None:
        for stop in _STOP_SIGNALS:  # a second signal must not cut the clean-up short
            signal.signal(stop, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(number).name)

    previous = {number: signal.signal(number, interrupt) for number in _STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _signal_of(interrupt: KeyboardInterrupt) -> tuple[str, int]:
    """The signal's name and the exit status 128 + its number (SIGINT 130, SIGTERM 143)."""
    name = interrupt.args[0] if interrupt.args else "SIGINT"
    return name, 128 + int(getattr(signal, name, signal.SIGINT))


def _os_error(exc: OSError) -> P2PDPError:
    """A one-line error for a file that cannot be read or written (disk full, permissions)."""
    where = f"{exc.filename}: " if exc.filename else ""
    return P2PDPError(f"{where}{exc.strerror or exc}")


def _add_report(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp report`` (owned by the report module's author)."""
    parser = subparsers.add_parser(
        "report", help="write figures and report.md from a results folder"
    )
    parser.add_argument("directory", help="a folder written by `p2pdp run`")
    parser.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from p2pdp.experiments.report.write import write_report

    with _signals_interrupt():
        return _report(write_report, Path(args.directory))


# --- components -------------------------------------------------------------------------------
def _add_components(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp components [KIND] [--json]``."""
    from p2pdp.core.components import KINDS

    parser = subparsers.add_parser(
        "components",
        help="list the registered components of every kind (or of KIND)",
        description="Every component a scenario can name: built-ins, registered ones and "
        "entry points of the group 'p2pdp.core.components'. Any config value that names a "
        "component also accepts an import string 'package.module:Name'.",
    )
    parser.add_argument("kind", nargs="?", choices=tuple(KINDS), help="only this kind")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_cmd_components)


def _cmd_components(args: argparse.Namespace) -> int:
    import json

    from p2pdp.config import ENGINE_READS, OPTION_READS, RUNTIME_READS
    from p2pdp.core.components import format_listing, listing
    from p2pdp.core.reads import describe

    rows = listing(args.kind)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_listing(rows))
    if args.kind is None:  # the rest of the declaration: what is read besides components
        print("\nread by every run:", ", ".join(ENGINE_READS))
        print("read by the runtime:")
        for runtime, keys in RUNTIME_READS.items():
            print(f"  {runtime:<11} {describe(keys)}")
        print("read only for some values of a setting (while that setting is read):")
        for setting, options in OPTION_READS.items():
            for value, keys in options.items():
                if keys:
                    print(f"  {setting} = {value!r}: {', '.join(keys)}")
    return 0


# --- split --------------------------------------------------------------------------------------
def _add_split(subparsers: argparse._SubParsersAction) -> None:
    """Register ``p2pdp split`` (per-host shard files for the network runtime)."""
    parser = subparsers.add_parser(
        "split",
        help="write one shard file per network host: its peers' training rows only",
        description="Cuts the scenario's data set as the simulator does (every fold and "
        "repetition it runs) and writes OUT/host-I.npz with its manifest OUT/host-I.json per "
        "host; name each host's manifest as `data` in the hosts file of `p2pdp run --runtime "
        "network` (see the network guide).",
    )
    parser.add_argument("scenario", help="a scenario TOML file, or a shipped scenario's name")
    parser.add_argument(
        "--hosts",
        metavar="N|FILE",
        required=True,
        help="the number of hosts, or the hosts file of the run (one shard file per entry)",
    )
    parser.add_argument("--out", required=True, help="the folder to write the files into")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting, as for `p2pdp run`",
    )
    _add_unset(parser)
    parser.set_defaults(func=_cmd_split)


def _cmd_split(args: argparse.Namespace) -> int:
    from p2pdp.experiments.network.hosts_file import read_hosts_file
    from p2pdp.experiments.network.shards import write_host_shards
    from p2pdp.experiments.scenarios.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.overrides, args.unset)
    setting = args.hosts.strip()
    if setting.lstrip("+-").isdigit():
        hosts = int(setting)
    elif Path(setting).exists():
        hosts = len(read_hosts_file(setting).addresses)
    else:
        raise ConfigError(
            f"--hosts = {args.hosts!r}: give the number of hosts or an existing hosts file"
        )
    for manifest in write_host_shards(scenario, hosts, args.out):
        print(manifest)
    return 0


# --- main -------------------------------------------------------------------------------------
class UsageError(ConfigError):
    """A command line argparse refuses (unknown option, bad value): one line, exit status 2."""


class _Formatter(argparse.HelpFormatter):
    """Writes ``%%`` in a description as ``%``, as argparse does in help strings (it leaves
    descriptions alone unless they name ``%(prog)s``), so both are written the same way."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(text if "%(prog)" in text else text.replace("%%", "%"))


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (:class:`UsageError`) pointing to
    ``--help``, printed by :func:`main` like every other error (its sub-commands' too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}  # the top parser's sub-commands

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _integer(minimum: int) -> Callable[[str], int]:
    """The argparse ``type`` of an integer flag that must be >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def build_parser() -> _Parser:
    parser = _Parser(
        prog="p2pdp",
        description="Simulator for peer-to-peer federated learning with differential privacy.",
    )
    parser.add_argument("--version", action="version", version=f"p2pdp {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in (_add_datasets, _add_audit, _add_run, _add_split, _add_report, _add_components):
        add(subparsers)
    parser.commands = dict(subparsers.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # the sub-command's error, pointing to its own --help
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        return int(args.func(args) or 0)
    except P2PDPError as exc:
        print(f"p2pdp: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `p2pdp datasets list | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file or folder that cannot be read or written, by any command
        print(f"p2pdp: error: {_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # before a command installed its own handling
        name, code = _signal_of(exc)
        print(f"\np2pdp: interrupted by {name}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
