"""CIFAR-10 from local files (python or binary version), deterministic synthetic data, and the tf.data pipeline."""

from __future__ import annotations

import io
import os
import pickle
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TRAIN_IMAGES = 50_000
TEST_IMAGES = 10_000
IMAGE_BYTES = 32 * 32 * 3
PY_FOLDER = "cifar-10-batches-py"
BIN_FOLDER = "cifar-10-batches-bin"
PY_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
PY_TEST_FILE = "test_batch"
BIN_TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
BIN_TEST_FILE = "test_batch.bin"
# CIFAR-10's batch files have known sizes: the python version's pickles 31,035,704 bytes
# (test_batch 31,035,526), the binary version's 30,730,000 (10,000 records of 3,073 bytes). A
# file or archive member that declares more is refused before it is read: a few MB of gzip can
# declare gigabytes.
MAX_BATCH_BYTES = 32 << 20
DATA_HELP = (
    "put CIFAR-10's python version (cifar-10-python.tar.gz or its cifar-10-batches-py folder) "
    "or binary version (cifar-10-batches-bin) in a folder and pass --data-dir, "
    "or place it in ~/.keras/datasets"
)


class DataError(Exception):
    """Data that cannot be used: missing, truncated, wrong shape or unsafe."""


@dataclass
class Arrays:
    x_train: np.ndarray  # uint8 (N, 32, 32, 3)
    y_train: np.ndarray  # int32 (N,)
    x_test: np.ndarray
    y_test: np.ndarray
    source: str  # "cifar10" or "synthetic"
    path: str | None = None


# ---------------------------------------------------------------- CIFAR-10, python version


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler that resolves only what CIFAR-10's batches contain, so a crafted pickle runs no code."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not part of a CIFAR-10 batch")


def _load_py_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        batch = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        raise DataError(f"{name}: unsafe or corrupt pickle ({exc})") from None
    except Exception as exc:  # truncated pickles raise EOFError, ValueError, ...
        raise DataError(
            f"{name}: cannot read CIFAR-10 batch ({type(exc).__name__}: {exc}); the file may be truncated"
        ) from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError(f"{name}: not a CIFAR-10 batch (expected a dict with 'data' and 'labels')")
    try:
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: labels or pixels are not numbers ({exc})") from None
    if labels.ndim != 1 or data.ndim != 2 or data.shape[1] != IMAGE_BYTES or data.shape[0] != labels.shape[0]:
        raise DataError(
            f"{name}: wrong shape {data.shape} for labels of shape {labels.shape} "
            f"(expected (N, {IMAGE_BYTES}) and (N,))"
        )
    if data.dtype != np.uint8:
        raise DataError(f"{name}: pixels are {data.dtype}, expected uint8")
    return _to_images(data), _check_labels(labels, name)


def _to_images(flat: np.ndarray) -> np.ndarray:
    """CIFAR stores channel-major rows; the model wants NHWC."""
    return np.ascontiguousarray(flat.astype(np.uint8, copy=False).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def _check_labels(labels: np.ndarray, name: str) -> np.ndarray:
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{name}: labels outside 0..9")
    return labels.astype(np.int32)


def _check_regular(path: Path) -> None:
    """A batch file that is missing, or a FIFO or device in its place (never read: it could block or
    not end), is a DataError saying which."""
    if path.is_file():
        return
    if not path.exists():
        raise DataError(f"{path}: missing CIFAR-10 batch file")
    raise DataError(
        f"{path}: {'a folder' if path.is_dir() else 'a FIFO or device'}, not a CIFAR-10 batch file; not read"
    )


def _check_batch_size(size: int, name: str) -> None:
    if size > MAX_BATCH_BYTES:
        raise DataError(
            f"{name}: declares {size:,} bytes, more than a CIFAR-10 batch file has "
            f"(at most {MAX_BATCH_BYTES:,}); not read"
        )


def _read_py_folder(folder: Path):
    def read(name):
        path = folder / name
        _check_regular(path)
        _check_batch_size(path.stat().st_size, str(path))
        return _load_py_batch(path.read_bytes(), str(path))

    return [read(n) for n in PY_TRAIN_FILES], read(PY_TEST_FILE)


def _read_py_tar(path: Path):
    try:
        with tarfile.open(path, "r:*") as tar:
            wanted = {*PY_TRAIN_FILES, PY_TEST_FILE}
            members = {}
            for member in tar:  # header by header: a member's size is checked before anything skips or reads it
                name = Path(member.name).name
                if member.isfile() and name in wanted:
                    _check_batch_size(member.size, f"{path}:{name}")
                    members[name] = member

            def read(name):
                member = tar.extractfile(members[name]) if name in members else None
                if member is None:
                    raise DataError(f"{path}: archive has no {name}")
                return _load_py_batch(member.read(), f"{path}:{name}")

            return [read(n) for n in PY_TRAIN_FILES], read(PY_TEST_FILE)
    except (tarfile.TarError, EOFError, OSError) as exc:
        # tarfile's "could not be opened" lists each compression it tried, a line each: the error is one line
        reason = (
            "not a tar archive, gzipped or not"
            if str(exc).startswith("file could not be opened")
            else " ".join(str(exc).split())
        )
        raise DataError(f"{path}: cannot read archive ({reason}); the file may be truncated") from None


# ---------------------------------------------------------------- CIFAR-10, binary version


def _read_bin_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    _check_regular(path)
    _check_batch_size(path.stat().st_size, str(path))
    raw = np.fromfile(path, dtype=np.uint8)
    record = 1 + IMAGE_BYTES
    if raw.size == 0 or raw.size % record:
        raise DataError(
            f"{path}: {raw.size} bytes is not a whole number of {record}-byte CIFAR-10 records; the file may be truncated"
        )
    rows = raw.reshape(-1, record)
    return _to_images(rows[:, 1:]), _check_labels(rows[:, 0].astype(np.int64), str(path))


def _read_bin_folder(folder: Path):
    return [_read_bin_file(folder / n) for n in BIN_TRAIN_FILES], _read_bin_file(folder / BIN_TEST_FILE)


# ---------------------------------------------------------------- locating files


def keras_cache_dir() -> Path:
    return Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "datasets"


def find_cifar10(root: Path) -> tuple[str, Path] | None:
    """Where CIFAR-10 lies under `root`: ('py'|'py-tar'|'bin', path), looking a few levels down
    because Keras versions nest the extracted folder differently."""
    root = Path(root)
    candidates = [root] + [p for p in root.glob("*") if p.is_dir()] + [p for p in root.glob("*/*") if p.is_dir()]
    for folder in candidates:  # a folder holding the files wins over one that is only named like CIFAR's
        if (folder / PY_TEST_FILE).is_file():
            return "py", folder
        if (folder / BIN_TEST_FILE).is_file():
            return "bin", folder
    for name in ("cifar-10-python.tar.gz", "cifar-10-batches-py.tar.gz"):
        for folder in candidates:
            if (folder / name).is_file():
                return "py-tar", folder / name
    for folder in candidates:  # CIFAR's folder name but files missing: read it, so the error names them
        if folder.name == PY_FOLDER and any(folder.iterdir()):
            return "py", folder
        if folder.name == BIN_FOLDER and any(folder.iterdir()):
            return "bin", folder
    return None


def load_cifar10(root: Path) -> Arrays:
    found = find_cifar10(root)
    if found is None:
        raise DataError(f"no CIFAR-10 files found in {root}: {DATA_HELP}")
    kind, path = found
    reader = {"py": _read_py_folder, "py-tar": _read_py_tar, "bin": _read_bin_folder}[kind]
    train, (x_test, y_test) = reader(path)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return Arrays(x_train, y_train, x_test, y_test, source="cifar10", path=str(path))


def download_cifar10() -> Arrays:
    import keras

    try:
        (x_train, y_train), (x_test, y_test) = keras.datasets.cifar10.load_data()
    except Exception as exc:
        raise DataError(f"CIFAR-10 download failed ({type(exc).__name__}); {DATA_HELP}") from None
    return Arrays(
        x_train,
        y_train.reshape(-1).astype(np.int32),
        x_test,
        y_test.reshape(-1).astype(np.int32),
        source="cifar10",
        path=str(keras_cache_dir()),
    )


# ---------------------------------------------------------------- synthetic

SYNTHETIC_SIGNAL = 0.1  # class pattern's strength against the pixel noise (0.2 was solved in one epoch)
SYNTHETIC_NOISE = 64.0  # pixel noise, standard deviation
SYNTHETIC_LABEL_NOISE = 0.2  # share of labels drawn at random: accuracy tops out near 0.8 + 0.2/10


def synthetic(train_images: int = TRAIN_IMAGES, test_images: int = TEST_IMAGES, seed: int = 0) -> Arrays:
    """CIFAR-shaped uint8 data that is learnable but not trivial.

    Each class is a fixed smooth colour pattern, faint under strong pixel noise (the patterns
    overlap: a single image is often closer to another class's pattern), and a fifth of the
    labels, train and test alike, are drawn at random. Accuracy then climbs over the first
    hundreds of steps and stays near 0.8, well below 100 %, as on real data.

    Deterministic in `seed`, and the first N images are the same whatever the total, so a
    `--limit-images` run trains on a prefix of the full set.
    """
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(10, 4, 4, 3))
    templates = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)  # (10, 32, 32, 3)

    def make(count, stream):
        # Classes, noise and label noise from separate streams, so none depends on `count` (prefix-stable).
        classes = np.random.default_rng([seed, stream, 0]).integers(0, 10, size=count).astype(np.int32)
        noise_gen = np.random.default_rng([seed, stream, 1])
        images = np.empty((count, 32, 32, 3), np.uint8)
        for start in range(0, count, 2048):  # chunks: the same values as one draw, a fraction of the memory
            stop = min(start + 2048, count)
            noise = noise_gen.normal(0, SYNTHETIC_NOISE, size=(stop - start, 32, 32, 3))
            pattern = SYNTHETIC_SIGNAL * (templates[classes[start:stop]] - 128)
            images[start:stop] = np.clip(128 + pattern + noise, 0, 255)
        random_label = np.random.default_rng([seed, stream, 2]).random(count) < SYNTHETIC_LABEL_NOISE
        other = np.random.default_rng([seed, stream, 3]).integers(0, 10, size=count).astype(np.int32)
        return images, np.where(random_label, other, classes).astype(np.int32)

    x_train, y_train = make(train_images, 1)
    x_test, y_test = make(test_images, 2)
    return Arrays(x_train, y_train, x_test, y_test, source="synthetic")


def _notice(text: str) -> None:
    print(text, file=sys.stderr)  # about the data, not output: stderr, beside warnings


def load(
    data: str,
    data_dir: str | None = None,
    limit_images: int | None = None,
    seed: int = 0,
    notice=_notice,
    limit_test_images: int | None = None,
) -> Arrays:
    """Resolve `--data auto|cifar10|synthetic` and `--data-dir` into arrays (the first
    `limit_images` training and `limit_test_images` test images where given)."""
    test_images = min(limit_test_images or TEST_IMAGES, TEST_IMAGES)
    if data_dir is not None:
        root = Path(data_dir)
        if not root.exists():
            raise DataError(f"data folder {root} does not exist")
        if data == "synthetic":
            raise DataError("--data-dir cannot be combined with --data synthetic")
        arrays = load_cifar10(root)
    elif data == "synthetic":
        arrays = synthetic(limit_images or TRAIN_IMAGES, test_images, seed=seed)
    else:
        local = find_cifar10(keras_cache_dir()) if keras_cache_dir().exists() else None
        if local is not None:
            arrays = load_cifar10(keras_cache_dir())
        elif data == "cifar10":
            arrays = download_cifar10()
        else:
            notice(
                "notice: CIFAR-10 not found locally; training on synthetic data "
                "(use --data-dir DIR or --data cifar10 for the real images)"
            )
            arrays = synthetic(limit_images or TRAIN_IMAGES, test_images, seed=seed)
    if limit_images:
        arrays.x_train, arrays.y_train = arrays.x_train[:limit_images], arrays.y_train[:limit_images]
    if limit_test_images:
        arrays.x_test, arrays.y_test = arrays.x_test[:limit_test_images], arrays.y_test[:limit_test_images]
    return arrays


# ---------------------------------------------------------------- tf.data


def _normalize(images, labels):
    import tensorflow as tf

    return tf.cast(images, tf.float32) * (1.0 / 255.0), labels


def train_dataset(
    x,
    y,
    batch_size: int,
    seed: int = 0,
    input_delay_ms: float = 0.0,
    shard: tuple[int, int] | None = None,
    drop_remainder: bool = False,
    prefetch: int | None = None,
    parallel_calls: int | None = None,
):
    """Shuffled, batched, normalized-after-batching, repeated, prefetched training data.

    Normalizing whole batches is one vectorized op instead of 100 small ones. The uint8
    arrays are already in memory, so there is nothing for `cache()` to save here.
    With `input_delay_ms`, every batch takes that much longer to produce, in a stage after
    the prefetch with tf.data's own prefetch injection off, so no buffer can hide it.
    With `shard` (count, index), only every count-th image from the index-th on: one worker's share;
    `drop_remainder` leaves out each pass's last partial batch (every batch has the same shape).
    `parallel_calls` (-1: AUTOTUNE) runs every map stage, the injected delay's included, on that
    many batches at once; `prefetch` (-1: AUTOTUNE) keeps that many batches ready after the last stage.
    None keeps the seed program's pipeline: normalizing on AUTOTUNE, the delay one batch at a time
    and unbuffered.
    """
    import tensorflow as tf

    ds = _sharded(tf.data.Dataset.from_tensor_slices((x, y)), shard)
    ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    ds = ds.map(
        _normalize,
        num_parallel_calls=tf.data.AUTOTUNE if parallel_calls is None else parallel_calls,
        deterministic=True,
    )
    ds = ds.repeat()  # epochs are counted in steps; each pass reshuffles, batches stay within a pass
    ds = ds.prefetch(tf.data.AUTOTUNE if prefetch is None or input_delay_ms > 0 else prefetch)
    if input_delay_ms > 0:
        ds = ds.map(_sleep_stage(input_delay_ms), num_parallel_calls=parallel_calls, deterministic=True)
        if prefetch is not None:
            ds = ds.prefetch(prefetch)
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        ds = ds.with_options(options)
    return ds


def _sleep_stage(delay_ms: float):
    import time

    import tensorflow as tf

    seconds = delay_ms / 1000.0

    def sleep():
        time.sleep(seconds)
        return np.int32(0)

    def stage(images, labels):
        done = tf.numpy_function(sleep, [], tf.int32, stateful=True)
        with tf.control_dependencies([done]):
            return tf.identity(images), tf.identity(labels)

    return stage


def _sharded(ds, shard: tuple[int, int] | None):
    return ds.shard(*shard) if shard is not None and shard[0] > 1 else ds


def eval_dataset(x, y, batch_size: int, shard: tuple[int, int] | None = None):
    import tensorflow as tf

    ds = _sharded(tf.data.Dataset.from_tensor_slices((x, y)), shard).batch(batch_size)
    ds = ds.map(_normalize, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.cache().prefetch(tf.data.AUTOTUNE)


def tuned_dataset(dataset, prefetch: int | None = None, parallel_calls: int | None = None):
    """A user's tf.data pipeline given the settings devprof can apply to one it did not build: its
    stateless map stages parallelized by tf.data itself (`parallel_calls`: -1, AUTOTUNE, the only value
    that reaches maps already made) and `prefetch` batches kept ready after its last stage (-1:
    AUTOTUNE). A stateful map (`tf.py_function`) stays one at a time: only its own
    `num_parallel_calls` changes that, which tune gives as code."""
    import tensorflow as tf

    if parallel_calls is not None:  # tf.data's defaults, where the pipeline turned them off
        options = tf.data.Options()
        options.autotune.enabled = True
        options.experimental_optimization.map_parallelization = True
        dataset = dataset.with_options(options)
    if prefetch is not None:
        dataset = dataset.prefetch(prefetch)
    return dataset
