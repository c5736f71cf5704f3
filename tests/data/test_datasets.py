"""Tests of the data sets (p2pdp.data: manifests, files, parsing, benchmarks, synthetic) and
the ``p2pdp datasets`` command. No test uses the network."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError, DataError
from p2pdp.data import benchmarks, manifests, parsing, synthetic
from p2pdp.data.benchmarks import Dataset, dataset_info, fetch_dataset, load_dataset
from p2pdp.data.files import data_home_candidates
from p2pdp.data.manifests import DataFile, Manifest, available_datasets, load_manifest
from p2pdp.data.settings import DataConfig
from p2pdp.experiments.cli import main

# Published in /work/shared/datasets/README.md: (rows, features, positives, test rows, test
# positives).
PUBLISHED = {
    "spambase": (4601, 57, 1813, None, None),
    "australian": (690, 14, 307, None, None),
    "adult": (32561, 123, 7841, 16281, 3846),
}


@pytest.fixture(autouse=True)
def user_cache(monkeypatch, tmp_path) -> Path:
    """Block the network, unset P2PDP_DATA_HOME and give each test its own user cache."""

    def no_network(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.delenv("P2PDP_DATA_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache" / "p2pdp"


@pytest.fixture(scope="module")
def real(real_data_home) -> dict[str, Dataset]:
    return {name: load_dataset(name, path=real_data_home, download=False) for name in PUBLISHED}


@pytest.fixture
def serve(monkeypatch, real_data_home):
    """Serve downloads from the real files (optionally corrupted); return the requested URLs."""
    requested: list[str] = []

    def install(*, corrupt: bool = False) -> list[str]:
        def fake_urlopen(url: str, timeout: float) -> io.BytesIO:
            assert timeout > 0
            requested.append(url)
            data = (real_data_home / url.rsplit("/", 1)[1]).read_bytes()
            return io.BytesIO(data[:-2] + b"7\n" if corrupt else data)

        monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
        return requested

    return install


def australian_lines(real_data_home: Path) -> list[str]:
    return (real_data_home / "australian.dat").read_text().splitlines()


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# --- manifests --------------------------------------------------------------------------------
def test_available_datasets():
    assert available_datasets() == ["adult", "australian", "spambase"]


def test_manifests_agree_with_published_checksums(real_data_home):
    published = dict(
        reversed(line.split()) for line in (real_data_home / "SHA256SUMS").read_text().splitlines()
    )
    in_manifests = {
        spec.name: spec.sha256
        for name in available_datasets()
        for spec in load_manifest(name).files
    }
    assert in_manifests == published


def test_manifest_feature_names_and_bounds():
    spambase = load_manifest("spambase").feature_names
    assert len(spambase) == 57
    assert spambase[0] == "word_freq_make"
    assert spambase[48:54] == tuple(f"char_freq_{c}" for c in ";([!$#")
    assert spambase[-1] == "capital_run_length_total"
    assert load_manifest("australian").feature_names == tuple(f"A{i}" for i in range(1, 15))
    assert load_manifest("adult").feature_bounds == ((0.0,) * 123, (1.0,) * 123)
    assert load_manifest("spambase").feature_bounds is None


VALID_TOY = """
name = "toy"
title = "Toy"
homepage = "https://example.org"
license = "CC0"
citation = "none"
format = "csv"
n_features = 2
negative_label = 0
positive_label = 1
feature_bounds = { low = 0, high = [1, 2] }

[[files]]
role = "train"
name = "toy.csv"
url = "https://example.org/toy.csv"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
rows = 3
positives = 1
"""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('license = "CC0"', 'license = "CC0"\ncolour = "red"', "unknown keys ['colour']"),
        ('title = "Toy"', "", "missing keys ['title']"),
        ("rows = 3", "", "missing keys ['rows']"),
        ('name = "toy"', 'name = "other"', "name must be 'toy'"),
        ("n_features = 2", "n_features = [2", "invalid TOML"),
        ("high = [1, 2]", "high = [1, 2, 3]", "feature_bounds must be a table"),
        ("high = [1, 2]", "high = [1, -1]", "low <= high"),
        ('format = "csv"', 'format = "xls"', "format must be one of"),
        ("rows = 3", "rows = 0", "rows must be an integer >= 1, got 0"),
        ("positives = 1", "positives = 4", "positives must be an integer in 0..3, got 4"),
        ('sha256 = "0000', 'sha256 = "X000', "sha256 must be 64 lowercase hex digits"),
        ('role = "train"', 'role = "test"', "got roles ['test']"),
    ],
)
def test_bad_manifest_raises_config_error(monkeypatch, tmp_path, old, new, message):
    assert old in VALID_TOY
    (tmp_path / "toy.toml").write_text(VALID_TOY.replace(old, new))
    monkeypatch.setattr(manifests, "_manifest_dir", lambda: tmp_path)
    with pytest.raises(ConfigError, match=None) as caught:
        load_manifest("toy")
    assert message in str(caught.value)


def test_valid_toy_manifest_expands_scalar_bounds(monkeypatch, tmp_path):
    (tmp_path / "toy.toml").write_text(VALID_TOY)
    monkeypatch.setattr(manifests, "_manifest_dir", lambda: tmp_path)
    assert load_manifest("toy").feature_bounds == ((0.0, 0.0), (1.0, 2.0))


def test_unknown_dataset_name():
    with pytest.raises(ConfigError, match=r"dataset must be one of \['adult'.*got 'mnist'"):
        load_dataset("mnist", download=False)


def test_manifest_objects_validate_directly():
    spec = DataFile(role="train", name="a", url="https://x/a", sha256="0" * 64, rows=2, positives=1)
    common = dict(
        name="m", title="", homepage="", license="", citation="", format="csv",
        negative_label=0, positive_label=1, files=(spec,),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="feature_names must be 2 distinct names, got 1"):
        Manifest(**common, n_features=2, feature_names=("x",))
    with pytest.raises(ConfigError, match="files must be one 'train' file"):
        Manifest(**{**common, "files": (spec, spec)}, n_features=2)
    with pytest.raises(ConfigError, match="url must start with https://"):
        DataFile(role="train", name="a", url="ftp://x/a", sha256="0" * 64, rows=2, positives=1)


# --- real data --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PUBLISHED)
def test_real_data_shapes_and_class_counts(real, name):
    rows, features, positives, test_rows, test_positives = PUBLISHED[name]
    dataset = real[name]
    assert dataset.name == name
    assert dataset.X.shape == (rows, features) and dataset.X.dtype == np.float64
    assert dataset.y.shape == (rows,) and dataset.y.dtype == np.int8
    assert set(np.unique(dataset.y)) == {-1, 1}
    assert (dataset.y == 1).sum() == positives
    if test_rows is None:
        assert dataset.X_test is None and dataset.y_test is None
    else:
        assert dataset.X_test.shape == (test_rows, features)
        assert (dataset.y_test == 1).sum() == test_positives
        assert (dataset.y_test == -1).sum() == test_rows - test_positives


def test_adult_is_binary_with_123_features(real):
    adult = real["adult"]
    # README: 451,592 and 225,731 non-zeros; feature 123 is used by one training row only.
    assert np.count_nonzero(adult.X) == 451_592
    assert np.count_nonzero(adult.X_test) == 225_731
    assert adult.X[:, 122].sum() == 1 and adult.X_test[:, 122].sum() == 0
    assert set(np.unique(adult.X)) == {0.0, 1.0}
    low, high = adult.feature_bounds
    np.testing.assert_array_equal(low, np.zeros(123))
    np.testing.assert_array_equal(high, np.ones(123))
    assert real["spambase"].feature_bounds is None


@pytest.mark.parametrize(("name", "file", "delimiter"), [
    ("spambase", "spambase.data", ","), ("australian", "australian.dat", " "),
])  # fmt: skip
def test_values_and_label_mapping_match_the_raw_file(real, real_data_home, name, file, delimiter):
    with open(real_data_home / file, newline="") as handle:
        raw = np.array(list(csv.reader(handle, delimiter=delimiter)), dtype=float)
    np.testing.assert_array_equal(real[name].X, raw[:, :-1])
    np.testing.assert_array_equal(real[name].y, np.where(raw[:, -1] == 1, 1, -1))
    assert real[name].feature_names == load_manifest(name).feature_names


def test_arrays_are_read_only(real):
    with pytest.raises(ValueError, match="read-only"):
        real["australian"].X[0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        real["australian"].y[0] = 1


# --- resolution order -------------------------------------------------------------------------
def test_resolution_order_path_then_env_then_cache(
    monkeypatch, tmp_path, real_data_home, user_cache
):
    source = real_data_home / "australian.dat"
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    for directory in (explicit, env, user_cache):
        directory.mkdir(parents=True)
        shutil.copy(source, directory)
    monkeypatch.setenv("P2PDP_DATA_HOME", str(env))
    assert data_home_candidates() == [env, user_cache]

    def found(**kwargs) -> Path:
        return load_dataset("australian", download=False, **kwargs).files[0].parent

    assert found(path=explicit) == explicit
    assert found(path=tmp_path) == env  # a directory without the file falls through
    assert found() == env
    monkeypatch.delenv("P2PDP_DATA_HOME")
    assert data_home_candidates() == [user_cache]
    assert found() == user_cache
    assert dataset_info("australian")["files"][0]["origin"] == "user cache"


def test_explicit_file_with_another_name_skips_the_checksum(tmp_path, real_data_home):
    copy = tmp_path / "my-copy.txt"
    shutil.copy(real_data_home / "australian.dat", copy)
    assert load_dataset("australian", path=copy, download=False).files == (copy,)
    (file_report,) = dataset_info("australian", path=copy)["files"]
    assert file_report["origin"] == "path argument" and file_report["sha256_ok"] is None


def test_file_path_for_a_two_file_dataset_is_rejected(real_data_home):
    with pytest.raises(ConfigError, match=r"path must be a directory holding \['a9a', 'a9a.t'\]"):
        load_dataset("adult", path=real_data_home / "a9a", download=False)


def test_nonexistent_path_is_an_error(tmp_path):
    with pytest.raises(DataError, match="does-not-exist does not exist"):
        load_dataset("australian", path=tmp_path / "does-not-exist")


def test_missing_file_message_lists_every_place_and_the_fixes(monkeypatch, tmp_path, user_cache):
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir()
    monkeypatch.setenv("P2PDP_DATA_HOME", str(env))
    with pytest.raises(DataError) as caught:
        load_dataset("adult", path=explicit, download=False)
    message = str(caught.value)
    for expected in (
        "data file 'a9a' of data set 'adult' not found",
        f"{explicit / 'a9a'} (path argument)",
        f"{env / 'a9a'} ($P2PDP_DATA_HOME)",
        f"{user_cache / 'a9a'} (user cache)",
        "download=False",
        "export P2PDP_DATA_HOME=/dir/with/files",
        "p2pdp datasets fetch adult",
        "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/a9a",
    ):
        assert expected in message
    assert "is not set" not in message
    monkeypatch.delenv("P2PDP_DATA_HOME")
    with pytest.raises(DataError, match=r"\(\$P2PDP_DATA_HOME is not set\)"):
        load_dataset("adult", download=False)


def test_failed_download_is_reported_with_the_fixes(monkeypatch, user_cache):
    def unreachable(url, timeout):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    with pytest.raises(DataError) as caught:
        load_dataset("spambase")
    message = str(caught.value)
    assert "could not download" in message and "no route to host" in message
    assert "p2pdp datasets fetch spambase" in message
    assert list(user_cache.iterdir()) == []  # the temporary file is gone


# --- downloads --------------------------------------------------------------------------------
def test_download_into_the_cache(serve, real_data_home, user_cache):
    requested = serve()
    dataset = load_dataset("australian")
    target = user_cache / "australian.dat"
    assert requested == [load_manifest("australian").files[0].url]
    assert dataset.files == (target,)
    assert target.read_bytes() == (real_data_home / "australian.dat").read_bytes()
    assert list(user_cache.iterdir()) == [target]
    load_dataset("australian")
    assert len(requested) == 1  # served from the cache the second time


def test_download_with_a_bad_checksum_keeps_nothing(serve, user_cache):
    serve(corrupt=True)
    with pytest.raises(DataError) as caught:
        load_dataset("australian")
    message = str(caught.value)
    assert load_manifest("australian").files[0].sha256 in message
    assert "the download was discarded" in message
    assert list(user_cache.iterdir()) == []


def test_fetch_dataset_downloads_once_unless_forced(serve, user_cache):
    requested = serve()
    paths = fetch_dataset("adult")
    assert paths == [user_cache / "a9a", user_cache / "a9a.t"]
    assert len(requested) == 2
    fetch_dataset("adult")
    assert len(requested) == 2
    fetch_dataset("adult", force=True)
    assert len(requested) == 4
    (user_cache / "a9a").write_bytes(b"damaged")
    fetch_dataset("adult")
    assert requested[4:] == [load_manifest("adult").files[0].url]
    assert hashlib.sha256((user_cache / "a9a").read_bytes()).hexdigest() == (
        load_manifest("adult").files[0].sha256
    )


# --- bad files --------------------------------------------------------------------------------
def test_checksum_mismatch_names_file_and_both_hashes(tmp_path, real_data_home):
    lines = australian_lines(real_data_home)
    assert lines[0].startswith("1 22.08 ")
    lines[0] = lines[0].replace("1 22.08 ", "1 22.09 ", 1)
    path = write_lines(tmp_path / "australian.dat", lines)
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(DataError) as caught:
        load_dataset("australian", path=tmp_path, download=False)
    message = str(caught.value)
    assert str(path) in message and actual in message
    assert load_manifest("australian").files[0].sha256 in message
    modified = load_dataset("australian", path=tmp_path, download=False, verify=False)
    assert modified.X[0, 1] == 22.09
    assert dataset_info("australian", path=tmp_path)["files"][0]["sha256_ok"] is False


def edit_line(number: int, edit):
    """A change to the australian lines that edits 1-based line ``number``."""

    def change(lines: list[str]) -> list[str]:
        lines[number - 1] = edit(lines[number - 1])
        return lines

    return change


def set_cell(column: int, value: str):
    def edit(line: str) -> str:
        cells = line.split(" ")
        cells[column - 1] = value
        return " ".join(cells)

    return edit


def flip_first_positive(lines: list[str]) -> list[str]:
    first = next(i for i, line in enumerate(lines) if line.endswith(" 1"))
    lines[first] = lines[first][:-1] + "0"
    return lines


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (edit_line(3, lambda line: line.rsplit(" ", 1)[0]), "line 3: 14 columns, expected 15"),
        (lambda lines: [line + " 0" for line in lines], "line 1: 16 columns, expected 15"),
        (edit_line(5, set_cell(2, "NA")), "line 5: column 2: non-numeric cell 'NA'"),
        (lambda lines: ["", *edit_line(5, set_cell(2, "NA"))(lines)], "line 6: column 2"),
        (edit_line(7, set_cell(15, "2")), "line 7: unexpected label 2, expected 0 (negative)"),
        (edit_line(9, set_cell(3, "nan")), "line 9: feature 3 (A3) is nan, not a finite"),
        (edit_line(9, set_cell(3, "1_0")), "cannot be read as whitespace"),
        (lambda lines: lines[:-1], "689 data lines, the manifest of 'australian' expects 690"),
        (lambda lines: [*lines, lines[0]], "691 data lines"),
        (flip_first_positive, "306 positive labels, the manifest of 'australian'"),
        (lambda lines: [], "the file is empty"),
        (lambda lines: ["  ", ""], "the file is empty"),
    ],
)
def test_bad_dense_file_names_the_line_and_problem(tmp_path, real_data_home, change, message):
    path = write_lines(tmp_path / "my-australian.dat", change(australian_lines(real_data_home)))
    with pytest.raises(DataError) as caught:
        load_dataset("australian", path=path, download=False)
    assert str(caught.value).startswith(str(path))
    assert message in str(caught.value)


def test_trailing_comma_in_csv(tmp_path, real_data_home):
    lines = (real_data_home / "spambase.data").read_text().splitlines()
    lines[1] += ","
    path = write_lines(tmp_path / "spam.csv", lines)
    with pytest.raises(DataError, match="line 2: 59 columns, expected 58 .57 features"):
        load_dataset("spambase", path=path, download=False)


def test_binary_file_is_a_data_error(tmp_path):
    path = tmp_path / "binary.dat"
    path.write_bytes(b"1 2\n\xff\xfe\n")
    with pytest.raises(DataError, match="not a text file .byte 4 is not UTF-8"):
        load_dataset("australian", path=path, download=False)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("+1 0:1", "feature index 0 is outside 1..123"),
        ("+1 124:1", "feature index 124 is outside 1..123"),
        ("+1 99999999999999999999:1", "is outside 1..123"),
        ("+1 5:1 3:1", "feature indices must increase, got 3 after 5"),
        ("+1 5:1 5:1", "got 5 after 5"),
        ("+1 3:x", "value 'x' of feature 3 is not a number"),
        ("+1 3.5:1", "feature index '3.5' is not an integer"),
        ("+1 3", "token '3' is not <index>:<value>"),
        ("yes 3:1", "label 'yes' is not a number"),
        ("2 3:1", "unexpected label 2, expected -1 (negative) or 1 (positive)"),
        ("+1 3:2", "feature 3 = 2 is outside the manifest's data-independent bounds [0, 1]"),
        ("+1 3:inf", "feature 3 is inf, not a finite number"),
    ],
)
def test_bad_libsvm_file_names_the_line_and_problem(
    monkeypatch, tmp_path, real_data_home, bad_line, message
):
    monkeypatch.setenv("P2PDP_DATA_HOME", str(real_data_home))  # a9a.t comes from there
    # Comment and blank lines count in line numbers.
    path = write_lines(tmp_path / "a9a", ["# header", "-1 1:1 5:1 ", "", bad_line])
    with pytest.raises(DataError) as caught:
        load_dataset("adult", path=tmp_path, download=False, verify=False)
    assert str(caught.value).startswith(f"{path}, line 4: ")
    assert message in str(caught.value)


def test_short_libsvm_file_is_truncated(tmp_path, real_data_home):
    shutil.copy(real_data_home / "a9a.t", tmp_path)
    write_lines(tmp_path / "a9a", ["-1 1:1 5:1 # comment", "+1 2:1"])
    with pytest.raises(DataError, match="2 data lines, the manifest of 'adult' expects 32561"):
        load_dataset("adult", path=tmp_path, download=False, verify=False)


# --- the Dataset container --------------------------------------------------------------------
def test_dataset_converts_and_validates():
    X = np.array([[0, 1], [2, 3]])
    dataset = Dataset(
        name="toy", X=X, y=[1, -1], feature_names=("a", "b"), X_test=None, y_test=None,
        files=(), feature_bounds=([0, 0], [5, 5]),
    )  # fmt: skip
    assert dataset.X.dtype == np.float64 and dataset.y.dtype == np.int8
    assert not dataset.X.flags.writeable and X.flags.writeable
    assert dataset.feature_bounds[1].tolist() == [5.0, 5.0]
    common = dict(name="toy", X=X, y=[1, -1], feature_names=None, files=(), feature_bounds=None)
    with pytest.raises(
        ConfigError, match=r"Dataset.y must hold only -1 and \+1, got values \[0, 1"
    ):
        Dataset(**{**common, "y": [0, 1]}, X_test=None, y_test=None)
    with pytest.raises(ConfigError, match=r"Dataset.test X must have shape \(n, 2\), got \(1, 3\)"):
        Dataset(**common, X_test=[[0, 0, 0]], y_test=[1])
    with pytest.raises(ConfigError, match="must both be given or both None"):
        Dataset(**common, X_test=X, y_test=None)
    with pytest.raises(ConfigError, match="Dataset.X must be finite"):
        Dataset(**{**common, "X": [[0, np.nan], [1, 1]]}, X_test=None, y_test=None)


# --- the built-in loaders (data.dataset = "spambase" ...) --------------------------------------
def test_built_in_loader_reads_data_path(tmp_path, real_data_home):
    copy = tmp_path / "my-spambase.csv"
    shutil.copy(real_data_home / "spambase.data", copy)
    raw = benchmarks.spambase(DataConfig(dataset="spambase", path=str(copy)))
    expected = load_dataset("spambase", path=copy, download=False)
    assert raw.name == "spambase" and raw.X_test is None and raw.feature_bounds is None
    np.testing.assert_array_equal(raw.X, expected.X)
    np.testing.assert_array_equal(raw.y, expected.y)
    with pytest.raises(DataError, match="does-not-exist does not exist"):
        benchmarks.australian(
            DataConfig(dataset="australian", path=str(tmp_path / "does-not-exist"))
        )


# --- command line -----------------------------------------------------------------------------
def test_cli_list(capsys):
    assert main(["datasets", "list"]) == 0
    out = capsys.readouterr().out
    assert "32561 + 16281" in out
    for name in available_datasets():
        assert name in out


def test_cli_info_json(capsys, real_data_home):
    assert main(["datasets", "info", "adult", "--json", "--path", str(real_data_home)]) == 0
    info = json.loads(capsys.readouterr().out)
    rows, features, positives, test_rows, test_positives = PUBLISHED["adult"]
    assert (info["name"], info["rows"], info["features"]) == ("adult", rows, features)
    assert (info["positives"], info["negatives"]) == (positives, rows - positives)
    assert (info["test_rows"], info["test_positives"]) == (test_rows, test_positives)
    assert [file["name"] for file in info["files"]] == ["a9a", "a9a.t"]
    assert all(file["sha256_ok"] for file in info["files"])


def test_cli_info_text_uses_the_environment(monkeypatch, capsys, real_data_home):
    monkeypatch.setenv("P2PDP_DATA_HOME", str(real_data_home))
    assert main(["datasets", "info", "spambase"]) == 0
    out = capsys.readouterr().out
    assert "4601 rows, 1813 positive, 2788 negative" in out
    assert f"{real_data_home / 'spambase.data'} ($P2PDP_DATA_HOME, sha256 ok)" in out
    assert "test" not in out


def test_cli_fetch(serve, capsys, user_cache):
    requested = serve()
    assert main(["datasets", "fetch", "australian"]) == 0
    assert capsys.readouterr().out.strip() == f"australian: {user_cache / 'australian.dat'}"
    assert main(["datasets", "fetch", "--all", "--force"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert len(requested) == 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["datasets", "info", "mnist"], "dataset must be one of"),
        (["datasets", "info", "australian"], "p2pdp datasets fetch australian"),
    ],
)
def test_cli_errors_are_printed_cleanly(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("p2pdp: error: ") and message in captured.err
    assert "Traceback" not in captured.err


# --- synthetic rows: blocks from spawned seeds, drawn in the local workers -------------------
def test_synthetic_blocks_come_from_spawned_seeds_and_are_pure_functions_of_their_index():
    from scipy import integrate, stats

    from p2pdp.core.rng import generator

    seed_seq = generator(5, "synthetic").bit_generator.seed_seq
    spawned = generator(5, "synthetic").bit_generator.seed_seq.spawn(4)
    for child in range(4):  # the children SeedSequence.spawn gives, whatever came before
        np.testing.assert_array_equal(
            synthetic.synthetic_seed(seed_seq, child).generate_state(8),
            spawned[child].generate_state(8),
        )
    expected, _ = integrate.quad(lambda z: np.logaddexp(0, z) * stats.norm.pdf(z), -40, 40)
    assert synthetic.LOG1P_LOGNORMAL_MEAN == pytest.approx(expected, rel=1e-12)
    B = synthetic.SYNTHETIC_BLOCK_ROWS
    X, y, X_test, y_test = synthetic.make_synthetic(B + 10, 30, 3, rng=generator(5, "synthetic"))
    Xb, yb = synthetic.synthetic_block(seed_seq, 1, n_total=B + 40, n_features=3)
    assert Xb.shape == (40, 3)  # the short last block: 10 training and 30 test rows
    np.testing.assert_allclose(np.vstack([X[B:], X_test]), Xb, rtol=1e-15)
    np.testing.assert_array_equal(np.concatenate([y[B:], y_test]), yb)
    assert 0.4 < (y == 1).mean() < 0.6  # logits centred by the log-features' expectation
    with pytest.raises(ValueError, match="block 2 is outside the"):
        synthetic.synthetic_block(seed_seq, 2, n_total=B + 40, n_features=3)


def test_synthetic_rows_and_their_transform_are_the_same_for_any_number_of_workers(monkeypatch):
    """Blocks drawn (and the fixed split's transformed in place) in 2 forked workers, into
    shared memory, give the rows one process gives: labels and fold rows exactly, features
    to rounding."""
    from p2pdp.core.parallel import is_shared, local_workers
    from p2pdp.learning.settings import EvaluationConfig
    from p2pdp.tasks.pipeline import load_fold

    # the data's own block size (which rows a block's seed draws): 5 blocks, a short last
    monkeypatch.setattr(synthetic, "SYNTHETIC_BLOCK_ROWS", 500)
    data = DataConfig(dataset="synthetic", synthetic_rows=1800, synthetic_test_rows=400,
                      synthetic_features=6)  # fmt: skip
    folds = {}
    for workers in (1, 2):
        with local_workers(workers):
            for split in ("fixed", "cv"):
                folds[workers, split] = load_fold(
                    data, EvaluationConfig(split=split, cv_folds=4), seed=9, fold=1
                )
    for split in ("fixed", "cv"):
        one, two = folds[1, split], folds[2, split]
        assert not is_shared(one.X_train)
        if split == "fixed":  # the rows drawn in the workers, transformed where they are
            assert is_shared(two.X_train)  # (the transform's own blocks: test_preprocess.py)
        np.testing.assert_array_equal(two.y_train, one.y_train)
        np.testing.assert_array_equal(two.y_test, one.y_test)
        np.testing.assert_allclose(two.X_train, one.X_train, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(two.X_test, one.X_test, rtol=1e-13, atol=1e-15)
        assert np.abs(one.X_train).max() > 0  # the rows were written, not left empty


def test_a_file_is_parsed_once_per_process_and_again_when_it_changes(
    monkeypatch, tmp_path, real_data_home
):
    """A sweep loads its data set for every fold: the same bytes are parsed once (the arrays
    shared, read-only); other bytes under the same name are parsed afresh."""
    parsed = []
    parse = parsing._parse
    monkeypatch.setattr(parsing, "_parse", lambda *a: parsed.append(a[1]) or parse(*a))
    monkeypatch.setattr(parsing, "_PARSED", {})
    lines = australian_lines(real_data_home)
    path = write_lines(tmp_path / "australian.dat", lines)
    first = load_dataset("australian", path=tmp_path, download=False)
    again = load_dataset("australian", path=tmp_path, download=False)
    assert parsed == [path]
    assert np.shares_memory(again.X, first.X) and not again.X.flags.writeable
    lines[0] = lines[0].replace("1 22.08 ", "1 22.09 ", 1)
    write_lines(path, lines)
    modified = load_dataset("australian", path=tmp_path, download=False, verify=False)
    assert parsed == [path, path] and modified.X[0, 1] == 22.09 and first.X[0, 1] == 22.08
