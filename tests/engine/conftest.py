"""Fixtures for the engine tests: one tiny random qwen2 folder per session (peaked logits, std 0.2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncrl.models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # GQA (4 query heads over 2 kv heads), q/k/v bias, tied embeddings: the qwen2.5 shape in miniature.
    return build_tiny_model(tmp_path_factory.mktemp("engine") / "qwen2", family="qwen2", seed=3, init_std=0.2,
                            max_position_embeddings=256)


@pytest.fixture(scope="package", autouse=True)
def single_thread() -> Iterator[None]:
    """Tiny matmuls gain nothing from threads, and OpenMP threads spinning against other processes on a
    2-core machine slow every op down 20x; restored afterwards for other test folders."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)
