"""The docs' blocks marked `<!-- vllm: ... -->` run as written in the vLLM environment (`scripts/vllm_cpu_venv.sh`,
where `.ci/run` runs the tests marked vllm): each page's vLLM blocks in order, in a fresh clone, from a fresh shell,
with the environment's `python` and `asyncrl` first on PATH. The rest of each page runs in the main environment
(tests/docs/test_docs.py). A page fails as there: a command that fails, a process left running, an untracked
file left behind. Cost: docs/external-servers.md starts two vLLM servers (~1.5 min on 2 cores) and trains 4 steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.rollout.vllm.engine_args import vllm_installed
from tests.docs.doc_blocks import doc_blocks
from tests.docs.test_docs import PAGES, REPO, assert_page_ran, fresh_clone, run_page

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2700),
              pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed here "
                                 "(bash scripts/vllm_cpu_venv.sh; docs/vllm.md)")]
VLLM_PAGES = [page for page in PAGES if any(block.marker == "vllm" for block in doc_blocks(REPO / page))]


def test_there_are_vllm_blocks():
    assert "docs/external-servers.md" in VLLM_PAGES


@pytest.mark.parametrize("page", VLLM_PAGES)
def test_the_vllm_blocks_of_every_page_run_as_written(page, tmp_path):
    root = fresh_clone(tmp_path / "asyncrl")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   "PYTHONPATH": str(root)}
    run = run_page(root, page, environment, runs=lambda block: block.marker == "vllm")
    assert_page_ran(run)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    assert status == "", f"{page} left untracked files:\n{status}"
