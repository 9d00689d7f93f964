"""CIFAR-10 files that are not what they declare: members and batch files larger than any CIFAR-10 batch
are refused before they are read, and an archive that is no archive is one line. No TensorFlow."""

from __future__ import annotations

import os

import pytest

DECLARED = 96 << 20  # three times the largest CIFAR-10 batch file; a few hundred kB of gzip


class _Zeros:
    """A file object of `size` zero bytes, made as it is read."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def _peak_bytes_while(function) -> tuple[BaseException | None, int]:
    import tracemalloc

    raised: BaseException | None
    tracemalloc.start()
    try:
        function()
    except Exception as exc:  # noqa: BLE001 - returned for the test to check
        raised = exc
    else:
        raised = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return raised, peak


def _assert_refused_unread(raised, peak, name):
    from models.data import DataError

    assert peak < 8 << 20, f"{peak:,} bytes allocated reading a file that was refused"
    assert isinstance(raised, DataError), raised
    assert f"{name}: declares {DECLARED:,} bytes, more than a CIFAR-10 batch file has" in str(raised), raised


# ---------------------------------------------------------------- CIFAR-10 files larger than CIFAR-10's


def test_a_cifar10_archive_member_declaring_more_than_a_batch_is_refused_unread(tmp_path):
    import tarfile

    from models import data

    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        member = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        member.size = DECLARED
        tar.addfile(member, _Zeros(DECLARED))
        for name in ("data_batch_2", "test_batch"):
            tar.addfile(tarfile.TarInfo(f"cifar-10-batches-py/{name}"))  # empty: never reached
    assert archive.stat().st_size < 1 << 20
    raised, peak = _peak_bytes_while(lambda: data.load_cifar10(tmp_path))
    _assert_refused_unread(raised, peak, f"{archive}:data_batch_1")


@pytest.mark.parametrize(
    "folder, name, test_name",
    [
        ("cifar-10-batches-py", "data_batch_1", "test_batch"),
        ("cifar-10-batches-bin", "data_batch_1.bin", "test_batch.bin"),
    ],
)
def test_a_cifar10_batch_file_larger_than_a_batch_is_refused_unread(tmp_path, folder, name, test_name):
    from models import data

    root = tmp_path / folder
    root.mkdir()
    (root / test_name).write_bytes(b"")
    with open(root / name, "wb") as sparse:  # no disk used: a hole of DECLARED bytes
        sparse.truncate(DECLARED)
    raised, peak = _peak_bytes_while(lambda: data.load_cifar10(tmp_path))
    _assert_refused_unread(raised, peak, str(root / name))


# ---------------------------------------------------------------- an archive that is no archive


def test_a_cifar_archive_that_is_no_archive_is_one_line(tmp_path):
    """tarfile's message lists every compression it tried, a line each."""
    from models.data import DataError, _read_py_tar

    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(os.urandom(4096))
    with pytest.raises(DataError) as info:
        _read_py_tar(archive)
    assert "\n" not in str(info.value) and "not a tar archive, gzipped or not" in str(info.value)
