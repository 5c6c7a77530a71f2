"""Fixtures for the model tests: one random tiny folder per family case, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.models import CausalLM, load_model

from .helpers import FAMILY_CASES, build_random_folder


@pytest.fixture(scope="session")
def family_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {case: build_random_folder(root / case, case, seed=index) for index, case in enumerate(FAMILY_CASES)}


@pytest.fixture()
def qwen2_model(family_folders: dict[str, Path]) -> CausalLM:
    return load_model(family_folders["qwen2_bias_tied"])
