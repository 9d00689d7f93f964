"""CIFAR-10 loading from files the tests write in CIFAR's own formats, synthetic data, tf.data.

Every batch file holds random pixels, so any wrong reshape or transpose of CIFAR's
channel-major rows shows up as a mismatch, and the crafted pickles would leave a marker
file behind if the loader ran any of their code.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import struct
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from models import data
from models.data import DataError

pytestmark = pytest.mark.slow  # every test here trains, imports TensorFlow or starts a process

PER_FILE = 20
FILES = data.PY_TRAIN_FILES + [data.PY_TEST_FILE]


# ---------------------------------------------------------------- writing CIFAR's formats


def make_batches(per_file: int = PER_FILE, seed: int = 7) -> dict[str, tuple[np.ndarray, list[int]]]:
    """{file name: (flat uint8 (N, 3072) channel-major rows, labels)} for the 5 train files + test."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in FILES:
        flat = rng.integers(0, 256, size=(per_file, data.IMAGE_BYTES), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_file)]
        out[name] = (flat, labels)
    return out


class Py2Pickler(pickle._Pickler):
    """Writes bytes the way Python 2's cPickle wrote `str` (SHORT_BINSTRING / BINSTRING), as in
    the real CIFAR-10 files; Python 3's protocol 2 would go through `_codecs.encode` instead."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_bytes(self, obj):
        n = len(obj)
        head = pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)
        # typeshed's _Pickler leaves out these two (undocumented) methods
        self.write(head + obj)  # type: ignore[attr-defined]
        self.memoize(obj)  # type: ignore[attr-defined]

    # typeshed types this table's functions as taking an Unpickler, not the pickler they are called on
    dispatch[bytes] = save_bytes  # type: ignore[assignment]


def py_batch_bytes(flat: np.ndarray, labels: list[int], name: str = "batch", protocol: str = "py2") -> bytes:
    """A batch as CIFAR's python version has it: a dict with bytes keys. `py2` mimics the
    distributed files (protocol 2 from Python 2, numpy.core module paths); `py3` is Python 3's default."""
    batch = {
        b"batch_label": f"training batch of {name}".encode(),
        b"labels": labels,
        b"data": flat,
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }
    return pickle.dumps(batch) if protocol == "py3" else py2_dumps(batch)


def py2_dumps(obj) -> bytes:
    out = io.BytesIO()
    Py2Pickler(out, protocol=2).dump(obj)
    return out.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def write_py_folder(folder: Path, batches, protocol: str = "py2") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (flat, labels) in batches.items():
        (folder / name).write_bytes(py_batch_bytes(flat, labels, name, protocol))
    (folder / "batches.meta").write_bytes(py2_dumps({b"label_names": [b"airplane"] * 10}))
    return folder


def write_py_tar(path: Path, batches) -> Path:
    """cifar-10-python.tar.gz as distributed: the cifar-10-batches-py folder, gzipped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as staging:
        folder = write_py_folder(Path(staging) / data.PY_FOLDER, batches)
        with tarfile.open(path, "w:gz") as tar:
            tar.add(folder, arcname=data.PY_FOLDER)
    return path


def write_bin_folder(folder: Path, batches) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    names = dict(zip(FILES, data.BIN_TRAIN_FILES + [data.BIN_TEST_FILE]))
    for name, (flat, labels) in batches.items():
        records = np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], flat], axis=1)
        (folder / names[name]).write_bytes(records.tobytes())
    (folder / "batches.meta.txt").write_text("airplane\n" * 10)
    return folder


def expected(batches):
    train = [batches[n] for n in data.PY_TRAIN_FILES]
    x_train = np.concatenate([f for f, _ in train])
    y_train = np.concatenate([np.asarray(label) for _, label in train])
    flat, labels = batches[data.PY_TEST_FILE]
    return x_train, y_train, flat, np.asarray(labels)


def nhwc_by_hand(flat: np.ndarray) -> np.ndarray:
    """CIFAR's layout written out: byte c*1024 + h*32 + w of a row is pixel (h, w), channel c."""
    out = np.empty((flat.shape[0], 32, 32, 3), dtype=np.uint8)
    for c in range(3):
        for h in range(32):
            for w in range(32):
                out[:, h, w, c] = flat[:, c * 1024 + h * 32 + w]
    return out


def check_arrays(arrays: data.Arrays, batches) -> None:
    x_train, y_train, x_test, y_test = expected(batches)
    assert arrays.source == "cifar10"
    assert arrays.x_train.shape == (5 * PER_FILE, 32, 32, 3) and arrays.x_train.dtype == np.uint8
    assert arrays.x_test.shape == (PER_FILE, 32, 32, 3) and arrays.x_test.dtype == np.uint8
    np.testing.assert_array_equal(arrays.x_train, nhwc_by_hand(x_train))
    np.testing.assert_array_equal(arrays.x_test, nhwc_by_hand(x_test))
    np.testing.assert_array_equal(arrays.y_train, y_train)
    np.testing.assert_array_equal(arrays.y_test, y_test)
    assert arrays.y_train.dtype == np.int32 and arrays.y_test.dtype == np.int32


@pytest.fixture
def batches():
    return make_batches()


@pytest.fixture
def empty_keras_home(tmp_path, monkeypatch):
    home = tmp_path / "keras_home"
    home.mkdir()
    monkeypatch.setenv("KERAS_HOME", str(home))
    return home


# ---------------------------------------------------------------- the formats


@pytest.mark.parametrize("protocol", ["py2", "py3"])
def test_python_folder_gives_nhwc_pixels_and_labels(tmp_path, batches, protocol):
    folder = write_py_folder(tmp_path / data.PY_FOLDER, batches, protocol=protocol)
    if protocol == "py2":  # the opcodes of the distributed files: Python 2 str, numpy.core paths
        raw = (folder / "data_batch_1").read_bytes()
        assert raw.startswith(b"\x80\x02") and b"U\x04data" in raw
        assert b"cnumpy.core.multiarray\n_reconstruct\n" in raw and b"_codecs" not in raw
    arrays = data.load_cifar10(tmp_path)
    check_arrays(arrays, batches)
    assert arrays.path is not None
    assert Path(arrays.path) == tmp_path / data.PY_FOLDER


def test_one_pixel_lands_where_cifar_puts_it(tmp_path):
    """A single known value at (image 3, row 5, column 17, blue) and zeros elsewhere."""
    batches = {name: (np.zeros((PER_FILE, data.IMAGE_BYTES), np.uint8), [0] * PER_FILE) for name in FILES}
    i, h, w, c = 3, 5, 17, 2
    batches["data_batch_2"][0][i, c * 1024 + h * 32 + w] = 201
    write_py_folder(tmp_path / data.PY_FOLDER, batches)
    x = data.load_cifar10(tmp_path).x_train
    n = PER_FILE + i  # data_batch_2 follows data_batch_1
    assert x[n, h, w, c] == 201
    assert int(x.sum()) == 201  # and nowhere else (a transposed read puts it elsewhere)


def test_python_tar_archive(tmp_path, batches):
    archive = write_py_tar(tmp_path / "cifar-10-python.tar.gz", batches)
    arrays = data.load_cifar10(tmp_path)
    check_arrays(arrays, batches)
    assert arrays.path == str(archive)


def test_binary_folder(tmp_path, batches):
    write_bin_folder(tmp_path / data.BIN_FOLDER, batches)
    check_arrays(data.load_cifar10(tmp_path), batches)


def test_limit_images_keeps_a_prefix_of_the_train_set(tmp_path, batches):
    write_bin_folder(tmp_path / data.BIN_FOLDER, batches)
    full = data.load("cifar10", str(tmp_path))
    limited = data.load("cifar10", str(tmp_path), limit_images=30)
    assert limited.x_train.shape == (30, 32, 32, 3) and limited.y_train.shape == (30,)
    np.testing.assert_array_equal(limited.x_train, full.x_train[:30])
    np.testing.assert_array_equal(limited.y_train, full.y_train[:30])
    np.testing.assert_array_equal(limited.x_test, full.x_test)  # the test set is not cut


# ---------------------------------------------------------------- finding the files


@pytest.mark.parametrize("layout", ["flat", "nested", "tar"])
def test_keras_cache_is_found_through_keras_home(tmp_path, batches, empty_keras_home, monkeypatch, layout):
    cache = empty_keras_home / "datasets"
    if layout == "flat":
        write_py_folder(cache / data.PY_FOLDER, batches)
    elif layout == "nested":  # what some Keras versions leave after extracting
        write_py_folder(cache / data.PY_FOLDER / data.PY_FOLDER, batches)
    else:
        write_py_tar(cache / "cifar-10-python.tar.gz", batches)
    assert data.keras_cache_dir() == cache

    def no_download():
        raise AssertionError("must not download when the cache holds CIFAR-10")

    monkeypatch.setattr(data, "download_cifar10", no_download)
    notices: list[str] = []
    for mode in ("auto", "cifar10"):
        arrays = data.load(mode, notice=notices.append)
        check_arrays(arrays, batches)
    assert notices == []


def test_auto_falls_back_to_synthetic_with_a_notice(empty_keras_home):
    notices: list[str] = []
    arrays = data.load("auto", limit_images=120, seed=3, notice=notices.append)
    assert arrays.source == "synthetic"
    assert len(notices) == 1 and "synthetic" in notices[0] and "--data-dir" in notices[0]
    assert arrays.x_train.shape == (120, 32, 32, 3)
    reference = data.synthetic(120, seed=3)
    np.testing.assert_array_equal(arrays.x_train, reference.x_train)
    np.testing.assert_array_equal(arrays.y_train, reference.y_train)


def test_synthetic_mode_routes_limit_and_seed(monkeypatch):
    calls = []
    real = data.synthetic

    def small(train_images=data.TRAIN_IMAGES, test_images=data.TEST_IMAGES, seed=0):
        calls.append((train_images, seed))
        return real(min(train_images, 50), 10, seed)

    monkeypatch.setattr(data, "synthetic", small)
    arrays = data.load("synthetic", limit_images=40, seed=5, notice=lambda m: pytest.fail(m))
    assert calls == [(40, 5)] and len(arrays.x_train) == 40
    data.load("synthetic", seed=1)  # no limit: the full CIFAR-sized set is asked for
    assert calls[-1] == (data.TRAIN_IMAGES, 1)


def test_data_dir_problems_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        data.load("auto", str(tmp_path / "nope"))
    with pytest.raises(DataError, match="no CIFAR-10 files found"):
        data.load("auto", str(tmp_path))
    with pytest.raises(DataError, match="synthetic"):
        data.load("synthetic", str(tmp_path))


def test_missing_batch_file_is_named(tmp_path, batches):
    folder = write_py_folder(tmp_path / data.PY_FOLDER, batches)
    (folder / "data_batch_4").unlink()
    with pytest.raises(DataError, match="data_batch_4"):
        data.load_cifar10(tmp_path)


@pytest.mark.parametrize("layout", ["py", "bin"])
def test_a_batch_file_that_is_a_fifo_is_named_as_such_not_as_missing(tmp_path, batches, layout):
    if layout == "py":
        folder = write_py_folder(tmp_path / data.PY_FOLDER, batches)
        name = "data_batch_4"
    else:
        folder = write_bin_folder(tmp_path / data.BIN_FOLDER, batches)
        name = "data_batch_4.bin"
    (folder / name).unlink()
    os.mkfifo(folder / name)
    with pytest.raises(DataError, match=f"{name}: a FIFO or device, not a CIFAR-10 batch file; not read"):
        data.load_cifar10(tmp_path)


# ---------------------------------------------------------------- unsafe and broken files


class _RunsShell:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _WritesFile:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "owned"))


@pytest.mark.parametrize("payload", ["shell-top-level", "shell-in-data", "write-in-labels"])
def test_crafted_pickle_runs_no_code(tmp_path, batches, payload):
    folder = write_py_folder(tmp_path / data.PY_FOLDER, batches)
    marker = tmp_path / "MARKER"
    if payload == "shell-top-level":
        evil = pickle.dumps(_RunsShell(marker))
    elif payload == "shell-in-data":
        evil = pickle.dumps({b"data": _RunsShell(marker), b"labels": [0] * PER_FILE})
    else:
        evil = pickle.dumps({b"data": batches["data_batch_1"][0], b"labels": _WritesFile(marker)})
    (folder / "data_batch_1").write_bytes(evil)
    with pytest.raises(DataError) as info:
        data.load_cifar10(tmp_path)
    message = str(info.value)
    assert "data_batch_1" in message and "unsafe" in message
    assert "refusing" in message  # says what it would not load
    assert not marker.exists(), "the crafted pickle ran code"


def test_crafted_pickle_inside_the_archive_runs_no_code(tmp_path, batches):
    staging = write_py_folder(tmp_path / "staging" / data.PY_FOLDER, batches)
    marker = tmp_path / "MARKER"
    (staging / "data_batch_3").write_bytes(pickle.dumps(_RunsShell(marker)))
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(staging, arcname=data.PY_FOLDER)
    with pytest.raises(DataError, match="data_batch_3.*unsafe"):
        data.load_cifar10(root)
    assert not marker.exists()


@pytest.mark.parametrize("keep", [0.5, 0.02, 0.99])
def test_truncated_pickle_is_named(tmp_path, batches, keep):
    folder = write_py_folder(tmp_path / data.PY_FOLDER, batches)
    path = folder / "data_batch_2"
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    with pytest.raises(DataError, match=r"data_batch_2\b"):
        data.load_cifar10(tmp_path)


def test_truncated_archive_is_a_data_error(tmp_path, batches):
    archive = write_py_tar(tmp_path / "root" / "cifar-10-python.tar.gz", batches)
    raw = archive.read_bytes()
    archive.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="cifar-10-python.tar.gz"):
        data.load_cifar10(tmp_path / "root")


@pytest.mark.parametrize("cut", [1, data.IMAGE_BYTES + 1 + 100, 5 * (data.IMAGE_BYTES + 1) - 1])
def test_truncated_binary_file_is_named(tmp_path, batches, cut):
    folder = write_bin_folder(tmp_path / data.BIN_FOLDER, batches)
    path = folder / "test_batch.bin"
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(DataError, match=r"test_batch\.bin.*truncated"):
        data.load_cifar10(tmp_path)


def test_empty_binary_file_is_a_data_error(tmp_path, batches):
    folder = write_bin_folder(tmp_path / data.BIN_FOLDER, batches)
    (folder / "data_batch_5.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"data_batch_5\.bin"):
        data.load_cifar10(tmp_path)


def test_binary_label_out_of_range_is_a_data_error(tmp_path, batches):
    folder = write_bin_folder(tmp_path / data.BIN_FOLDER, batches)
    raw = bytearray((folder / "data_batch_1.bin").read_bytes())
    raw[0] = 10
    (folder / "data_batch_1.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"data_batch_1\.bin.*labels"):
        data.load_cifar10(tmp_path)


@pytest.mark.parametrize(
    "batch, match",
    [
        ({b"data": np.zeros((PER_FILE, 3000), np.uint8), b"labels": [0] * PER_FILE}, "wrong shape"),
        ({b"data": np.zeros((PER_FILE, 32, 32, 3), np.uint8), b"labels": [0] * PER_FILE}, "wrong shape"),
        ({b"data": np.zeros((PER_FILE, data.IMAGE_BYTES), np.uint8), b"labels": [0] * (PER_FILE - 1)}, "wrong shape"),
        ({b"data": np.zeros((PER_FILE, data.IMAGE_BYTES), np.uint8), b"labels": [11] * PER_FILE}, "labels outside"),
        ({b"data": np.zeros((PER_FILE, data.IMAGE_BYTES), np.uint8), b"labels": 3}, "labels"),
        ({b"data": np.zeros((PER_FILE, data.IMAGE_BYTES), np.uint8), b"labels": [b"cat"] * PER_FILE}, "labels"),
        ({b"data": np.full((PER_FILE, data.IMAGE_BYTES), 300.0), b"labels": [0] * PER_FILE}, "uint8"),
        ({b"labels": [0] * PER_FILE}, "not a CIFAR-10 batch"),
        ([1, 2, 3], "not a CIFAR-10 batch"),
    ],
    ids=[
        "short-rows",
        "nhwc",
        "label-count",
        "label-value",
        "label-scalar",
        "label-bytes",
        "float-pixels",
        "no-data",
        "not-a-dict",
    ],
)
def test_wrong_shaped_batch_is_a_data_error(tmp_path, batches, batch, match):
    folder = write_py_folder(tmp_path / data.PY_FOLDER, batches)
    (folder / "test_batch").write_bytes(py2_dumps(batch))
    with pytest.raises(DataError, match=match) as info:
        data.load_cifar10(tmp_path)
    assert "test_batch" in str(info.value)


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_per_seed():
    a, b, c = data.synthetic(200, 50, seed=1), data.synthetic(200, 50, seed=1), data.synthetic(200, 50, seed=2)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.x_train, c.x_train)
    assert not np.array_equal(a.y_train, c.y_train)
    assert not np.array_equal(a.x_train, a.x_test[:50].repeat(4, axis=0))  # train and test differ


def test_synthetic_is_prefix_stable():
    small, large = data.synthetic(100, 20, seed=0), data.synthetic(500, 60, seed=0)
    np.testing.assert_array_equal(small.x_train, large.x_train[:100])
    np.testing.assert_array_equal(small.y_train, large.y_train[:100])
    np.testing.assert_array_equal(small.x_test, large.x_test[:20])


def test_synthetic_shapes_and_classes():
    a = data.synthetic(600, 300, seed=0)
    assert a.source == "synthetic"
    assert a.x_train.shape == (600, 32, 32, 3) and a.x_train.dtype == np.uint8
    assert a.x_test.shape == (300, 32, 32, 3) and a.x_test.dtype == np.uint8
    assert a.y_train.shape == (600,) and a.y_test.shape == (300,)
    assert set(a.y_train.tolist()) == set(range(10)) and set(a.y_test.tolist()) == set(range(10))
    assert a.x_train.min() < 30 and a.x_train.max() > 225  # spans the pixel range, not a constant


def test_synthetic_defaults_are_cifar_sizes():
    # The default call takes ~12 s and 3 GB here, too slow for a test; check what it asks for.
    params = inspect.signature(data.synthetic).parameters
    assert params["train_images"].default == data.TRAIN_IMAGES == 50_000
    assert params["test_images"].default == data.TEST_IMAGES == 10_000


def test_synthetic_classes_carry_signal():
    """A nearest-class-mean classifier fitted on the train set beats chance by far on the test set."""
    a = data.synthetic(1000, 500, seed=4)
    x = a.x_train.reshape(len(a.x_train), -1).astype(np.float32)
    means = np.stack([x[a.y_train == k].mean(axis=0) for k in range(10)])
    xt = a.x_test.reshape(len(a.x_test), -1).astype(np.float32)
    distances = (xt**2).sum(1)[:, None] - 2 * xt @ means.T + (means**2).sum(1)[None, :]
    accuracy = float((distances.argmin(axis=1) == a.y_test).mean())
    assert accuracy > 0.5, accuracy
    # and the labels alone do not give it away: shuffled labels fall back to about chance
    shuffled = np.random.default_rng(0).permutation(a.y_train)
    means = np.stack([x[shuffled == k].mean(axis=0) for k in range(10)])
    distances = (xt**2).sum(1)[:, None] - 2 * xt @ means.T + (means**2).sum(1)[None, :]
    assert float((distances.argmin(axis=1) == a.y_test).mean()) < 0.25


# ---------------------------------------------------------------- tf.data


def test_train_dataset_batches_are_normalized_and_complete():
    a = data.synthetic(250, 10, seed=0)
    ds = data.train_dataset(a.x_train, a.y_train, batch_size=100, seed=0)
    # The dataset repeats: epochs are counted in steps, and a partial batch ends each pass.
    passes = [(x.numpy(), y.numpy()) for x, y in ds.take(6)]
    epoch1 = passes[:3]
    assert [len(y) for _, y in passes] == [100, 100, 50, 100, 100, 50]
    for x, _ in epoch1:
        assert x.dtype == np.float32 and x.shape[1:] == (32, 32, 3)
        assert x.min() >= 0.0 and x.max() <= 1.0
    images = np.concatenate([x for x, _ in epoch1])
    labels = np.concatenate([y for _, y in epoch1])
    # every image exactly once, scaled by 1/255, with its own label
    order = np.argsort(images.reshape(len(images), -1)[:, :16].dot(256.0 ** -np.arange(16)))
    ref_order = np.argsort((a.x_train.reshape(250, -1)[:, :16] / 255.0).dot(256.0 ** -np.arange(16)))
    np.testing.assert_allclose(images[order], a.x_train[ref_order] / 255.0, atol=1e-6)
    np.testing.assert_array_equal(labels[order], a.y_train[ref_order])
    assert not np.array_equal(labels, a.y_train)  # shuffled
    epoch2 = np.concatenate([y for _, y in passes[3:]])
    assert sorted(epoch2) == sorted(labels)
    assert not np.array_equal(epoch2, labels)  # and reshuffled each epoch


def test_eval_dataset_keeps_order():
    a = data.synthetic(10, 130, seed=0)
    batches = list(data.eval_dataset(a.x_test, a.y_test, batch_size=100))
    assert [len(y) for _, y in batches] == [100, 30]
    np.testing.assert_allclose(np.concatenate([x.numpy() for x, _ in batches]), a.x_test / 255.0, atol=1e-6)
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y in batches]), a.y_test)


def test_input_delay_is_not_hidden_by_prefetch():
    """With the consumer idle for 0.2 s before each fetch, every prefetch buffer is full; the
    injected delay must still be paid inside next(). (A lower bound: sleep guarantees it.)"""
    a = data.synthetic(1000, 10, seed=0)
    it = iter(data.train_dataset(a.x_train, a.y_train, batch_size=50, input_delay_ms=30))
    next(it)
    waits = []
    for _ in range(4):
        time.sleep(0.2)
        began = time.perf_counter()
        x, y = next(it)
        waits.append(time.perf_counter() - began)
        assert x.shape == (50, 32, 32, 3)
    assert min(waits) >= 0.030, waits
