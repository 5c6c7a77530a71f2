"""The CUDA extensions' build lock (`asyncrl.engine.kernels.cuda_build`): a build killed midway leaves torch's lock file
behind, and torch's builder waits for it forever; ours waits for a live build and names a stale lock instead."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from asyncrl.engine.kernels import cuda_build


@pytest.fixture
def extensions_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path


def lock_of(root: Path, name: str, age_seconds: float) -> Path:
    (root / name).mkdir(parents=True, exist_ok=True)
    lock = root / name / "lock"
    lock.touch()
    stamp = time.time() - age_seconds
    os.utime(lock, (stamp, stamp))
    return lock


def test_a_stale_lock_fails_the_build_at_once_naming_the_file(extensions_dir):
    name = cuda_build.versioned_name("asyncrl_paged_decode")
    lock = lock_of(extensions_dir, name, age_seconds=cuda_build.STALE_LOCK_SECONDS + 60)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=f"locked by {lock}.*interrupted"):
        cuda_build.build_extension("asyncrl_paged_decode", cuda_build.SOURCES / "paged_decode.cu", "", [])
    assert time.monotonic() - started < 5  # it neither waited nor started nvcc
    assert lock.exists()  # left for the user to delete: another host may share the cache


def test_a_live_build_is_waited_for_until_its_lock_goes(extensions_dir):
    lock = lock_of(extensions_dir, "some_extension", age_seconds=1)
    removed_at: list[float] = []

    def finish_build() -> None:
        time.sleep(0.3)
        removed_at.append(time.monotonic())
        lock.unlink()

    builder = threading.Thread(target=finish_build)
    builder.start()
    cuda_build.wait_for_build_lock("some_extension", poll_seconds=0.05)
    returned_at = time.monotonic()
    builder.join()
    assert removed_at and returned_at >= removed_at[0]


def test_no_lock_returns_at_once(extensions_dir):
    started = time.monotonic()
    cuda_build.wait_for_build_lock("never_built")
    assert time.monotonic() - started < 1
    assert (extensions_dir / "never_built").is_dir()  # torch's build directory, as the builder would make it
