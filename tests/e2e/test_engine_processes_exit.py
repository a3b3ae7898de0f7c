"""A run whose engine runs in processes of its own (every GPU run) exits when its work is published."""

from __future__ import annotations

import time

import pytest

from tests.conftest import product_job
from tests.e2e.test_crash_recovery import start_run

pytestmark = pytest.mark.engine


def test_run_with_engine_processes_exits_once_published(tmp_path):
    # A fresh output folder: the engine starts in the background while the prompts are built, as on a first run.
    job = product_job(tmp_path, 4, sampling={"max_tokens": 8}, retry={"max_passes": 0},
                      engine={"multiprocessing": True})
    process, log = start_run(tmp_path, job)
    manifest = tmp_path / "out" / "current" / "manifest.json"
    deadline = time.monotonic() + 600
    while not manifest.exists():
        assert process.poll() is None, f"the run ended before publishing:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"nothing published after 600 s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    try:
        code = process.wait(timeout=120)
    except Exception:
        process.kill()
        raise AssertionError("the run published its output but its process had not exited 120 s later "
                             f"(vLLM's engine processes left running):\n{log.read_text()[-3000:]}") from None
    assert code == 0, log.read_text()[-3000:]
