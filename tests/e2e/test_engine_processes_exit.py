"""A run whose engine runs in processes of its own (every GPU run) exits when its work is published."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import ROOT, product_job
from tests.servers import prefect_home

pytestmark = pytest.mark.engine


# vLLM's engine processes are not daemons; vLLM stops them with weakref finalizers, whose exit hook Python registers
# when the first finalizer of the process is made. On the H200 host that came before multiprocessing registered its
# own exit hook, which then ran first and joined the engine processes forever. This prelude makes the same order
# on any machine (on this CPU's Python 3.11 it came the other way round by itself).
PRELUDE = ("import weakref, runpy, sys; weakref.finalize(sys, int); sys.argv[0] = 'batchgen'; "
           "runpy.run_module('batchgen.cli', run_name='__main__')")


def test_run_with_engine_processes_exits_once_published(tmp_path):
    # A fresh output folder: the engine starts in the background while the prompts are built, as on a first run.
    job = product_job(tmp_path, 4, sampling={"max_tokens": 8}, retry={"max_passes": 0},
                      engine={"multiprocessing": True})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    log = tmp_path / "run.log"
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-c", PRELUDE, "run", str(path)], cwd=ROOT,
                                   env={**os.environ, "PREFECT_HOME": str(prefect_home(tmp_path / "prefect-home"))},
                                   stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    manifest = tmp_path / "out" / "current" / "manifest.json"
    deadline = time.monotonic() + 600
    while not manifest.exists():
        assert process.poll() is None, f"the run ended before publishing:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"nothing published after 600 s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    try:
        code = process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        raise AssertionError("the run published its output but its process had not exited 120 s later "
                             f"(vLLM's engine processes left running):\n{log.read_text()[-3000:]}") from None
    assert code == 0, log.read_text()[-3000:]
