"""Finished work survives: SIGKILL in the middle of generation, and an engine worker dying mid-run; a run with
vLLM's engine processes exits once it has published."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from tests.conftest import ROOT, product_job
from tests.servers import prefect_home

pytestmark = pytest.mark.engine


# vLLM's engine processes are not daemons; vLLM stops them with weakref finalizers, whose exit hook Python registers
# when the first finalizer of the process is made. On the H200 host that came before multiprocessing registered its
# own exit hook, which then ran first and joined the engine processes forever. This prelude makes the same order
# on any machine (on this CPU's Python 3.11 it came the other way round by itself); the rerun below runs under it.
PRELUDE = ("import weakref, runpy, sys; weakref.finalize(sys, int); sys.argv[0] = 'batchgen'; "
           "runpy.run_module('batchgen.cli', run_name='__main__')")


def start_run(tmp_path: Path, job: dict, prelude: bool = False) -> tuple[subprocess.Popen, Path]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    # Prefect's task logs on the console (a quiet run keeps them for the UI only): the test reads the retry there.
    env = {**os.environ, "PREFECT_HOME": str(prefect_home(tmp_path / "prefect-home")),
           "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "INFO"}
    log = open(tmp_path / f"run-{time.time_ns()}.log", "w")
    command = [sys.executable, "-c", PRELUDE] if prelude else [sys.executable, "-m", "batchgen.cli"]
    process = subprocess.Popen([*command, "run", str(path)], cwd=ROOT, env=env,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process, Path(log.name)


def exits_once_published(process: subprocess.Popen, out: Path, log: Path, timeout: float = 900) -> int:
    """Wait for the run's publication, then for its process: a run whose engine runs in processes of its own (every
    GPU run) must exit once its work is published, not leave vLLM's engine processes running."""
    deadline = time.monotonic() + timeout
    while not (out / "current" / "manifest.json").exists():
        assert process.poll() is None, f"the run ended before publishing:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"nothing published after {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    try:
        return process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("the run published its output but its process had not exited 120 s later "
                             f"(vLLM's engine processes left running):\n{log.read_text()[-3000:]}") from None


def committed(out: Path) -> list[Path]:
    return sorted((out / ".batchgen" / "results").glob("chunk-*.parquet"))


def wait_for_commits(process: subprocess.Popen, out: Path, count: int, log: Path, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while len(committed(out)) < count:
        assert process.poll() is None, f"the run ended before {count} commits:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {count} commits after {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def check_exactly_once(out: Path, ids: list[str]) -> None:
    results = pd.read_parquet(out / "current" / "accepted" / "accepted.parquet")
    rejected = pd.read_parquet(out / "current" / "rejected" / "rejected.parquet")
    published = list(results["item_id"]) + list(rejected["item_id"])
    assert sorted(published) == sorted(ids)


ITEMS = 24


def crash_job(tmp_path: Path) -> dict:
    # Commits of 8 outputs each (never by time: commit_seconds out of reach), and 4 sequences at a time, so that
    # commits land one after another while most of the work is still to do (fed all at once, the 24 requests
    # would finish together); no retries so the work is one pass. The engine runs as on GPUs: vLLM's front end and
    # the engine stream in a process of their own (batchgen.engine_process), the engine core and model worker in
    # vLLM's processes, so that one of them can die while the run goes on. 24 items of 16 tokens: two commits
    # before the SIGKILL, one left for the rerun (this engine makes ~25 tokens/s on 2 cores).
    return product_job(tmp_path, ITEMS, sampling={"max_tokens": 16}, retry={"max_passes": 0}, chunk_size=8,
                       commit_seconds=3600,
                       engine={"multiprocessing": True, "front_end_process": True, "max_num_seqs": 4})


def engine_core_processes(root: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in root.children(recursive=True):
        try:
            name = " ".join(child.cmdline()) + " " + child.name()
        except psutil.Error:
            continue
        if "VLLM::" in name:  # vLLM titles its processes VLLM::EngineCore and VLLM::Worker
            found.append(child)
    return sorted(found, key=lambda p: "Worker" not in p.name())  # the model worker first


def test_engine_death_then_sigkill_lose_no_finished_work(tmp_path):
    """One run through both crashes (one run, so the suite starts three engines, not four):

    1. an engine worker dies after the first commit: Prefect's task retry starts a fresh engine in the
       same run, which goes on from the committed chunk;
    2. after a further commit the whole run (flow, engine, temporary Prefect server) is SIGKILLed:
       a rerun publishes every item once, reusing every committed result, and its process exits once it has
       published (its engine runs in processes of its own, under the exit-hook order that once hung on the H200
       host).
    """
    job = crash_job(tmp_path)
    out = tmp_path / "out"
    process, log = start_run(tmp_path, job)
    wait_for_commits(process, out, 1, log)
    victims = engine_core_processes(psutil.Process(process.pid))
    assert victims, "no engine process found under the run"
    victims[0].kill()
    at_engine_death = len(committed(out))

    wait_for_commits(process, out, at_engine_death + 1, log)  # the retry's fresh engine commits more
    text = log.read_text()
    assert "EngineDeadError" in text and "Retry 1/1 will start" in text  # Prefect's task retry
    os.killpg(process.pid, signal.SIGKILL)  # the run, its engine and its temporary Prefect server
    process.wait(timeout=60)
    rows_before = sum(len(pd.read_parquet(p)) for p in committed(out))
    assert rows_before >= 16 and not (out / "current").exists()

    rerun, log = start_run(tmp_path, job, prelude=True)  # engine processes again, with the H200 host's exit order
    assert exits_once_published(rerun, out, log) == 0, log.read_text()[-3000:]
    manifest = json.loads((out / "current" / "manifest.json").read_text())
    ids = list(pd.read_csv(tmp_path / "products.csv", dtype=str)["product_id"])
    check_exactly_once(out, ids)
    assert manifest["counts"]["items"] == ITEMS
    assert manifest["counts"]["reused"] >= rows_before  # every committed result, none generated twice
    assert manifest["tokens"]["generated_this_run"] > 0  # the rest was generated by the rerun
    attempts = pd.read_parquet(out / "current" / "attempts" / "attempts.parquet")
    assert not attempts.duplicated(["item_id", "candidate", "attempt"]).any()


def committed_attempts(out: Path) -> pd.DataFrame:
    frames = []
    for path in committed(out):
        try:
            frames.append(pd.read_parquet(path, columns=["item_id", "attempt", "finish_reason"]))
        except (OSError, ValueError):  # being written (commits are atomic renames, but the glob may race)
            continue
    return pd.concat(frames) if frames else pd.DataFrame(columns=["item_id", "attempt", "finish_reason"])


def wait_for_attempt(process: subprocess.Popen, out: Path, attempt: int, log: Path, timeout: float = 420) -> None:
    """Wait until an attempt numbered `attempt` (2: a retry) is committed, the run still going."""
    deadline = time.monotonic() + timeout
    while (committed_attempts(out)["attempt"] == attempt).sum() == 0:
        if process.poll() is not None or time.monotonic() > deadline:
            why = "the run ended before" if process.poll() is not None else f"in {timeout} s, no"
            raise AssertionError(f"{why} attempt {attempt} committed:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def test_sigkill_while_cut_off_outputs_are_retried_in_the_stream(tmp_path):
    """Cut-off outputs go back into the engine as soon as their commit lands (retry.in_stream, the default); the run
    is SIGKILLed once some of those retries are committed and others are still running. The rerun publishes every
    item once, reuses every committed attempt (first attempts and retries alike, found by their request keys), and
    retries each cut-off first attempt exactly once."""
    items = 24
    job = product_job(tmp_path, items, sampling={"max_tokens": 8}, retry={"max_passes": 1, "growth_factor": 2},
                      chunk_size=4, commit_seconds=3600, engine={"max_num_seqs": 4})
    out = tmp_path / "out"
    process, log = start_run(tmp_path, job)
    wait_for_attempt(process, out, 2, log)  # a retry made in the stream is committed
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    before = committed_attempts(out)
    first_cut = set(before.loc[(before["attempt"] == 1) & (before["finish_reason"] == "length"), "item_id"])
    assert (before["attempt"] == 2).sum() < len(first_cut) or len(before) < items, \
        "the run had finished its work before the SIGKILL: nothing was left to test"
    assert not (out / "current").exists()
    # retries went into the running batch ahead of the first attempts still waiting (vLLM's priority scheduling),
    # so a retry was committed while first attempts were still to come, not after the whole first pass
    assert (before["attempt"] == 1).sum() < items

    rerun, log = start_run(tmp_path, job)
    assert rerun.wait(timeout=900) == 0, log.read_text()[-3000:]
    check_exactly_once(out, list(pd.read_csv(tmp_path / "products.csv", dtype=str)["product_id"]))
    manifest = json.loads((out / "current" / "manifest.json").read_text())
    assert manifest["counts"]["reused"] >= len(before)  # every committed attempt, none generated twice
    attempts = pd.read_parquet(out / "current" / "attempts" / "attempts.parquet")
    assert not attempts.duplicated(["item_id", "candidate", "attempt"]).any()
    cut = set(attempts.loc[(attempts["attempt"] == 1) & (attempts["finish_reason"] == "length"), "item_id"])
    assert cut and set(attempts.loc[attempts["attempt"] == 2, "item_id"]) == cut  # each retried once
    assert first_cut <= cut and attempts["attempt"].max() == 2


def check_chains(attempts: pd.DataFrame, first_budget: int, max_passes: int) -> None:
    """Each item's attempts are 1, 2, ... once each, with budgets growing x2, and attempt k+1 exists exactly when
    attempt k was cut off and passes were left: no dropped spare request was published, none was missing."""
    assert not attempts.duplicated(["item_id", "candidate", "attempt"]).any()
    for item_id, chain in attempts.sort_values("attempt").groupby("item_id"):
        numbers = list(chain["attempt"])
        assert numbers == list(range(1, len(numbers) + 1)), (item_id, numbers)
        assert list(chain["max_tokens"]) == [first_budget * 2 ** i for i in range(len(numbers))], item_id
        reasons = list(chain["finish_reason"])
        assert all(reason == "length" for reason in reasons[:-1]), (item_id, reasons)
        assert reasons[-1] != "length" or len(numbers) == max_passes + 1, (item_id, reasons)


@pytest.mark.parametrize("strategy", ["grow", "continue_then_grow"])
def test_retries_started_ahead_publish_the_same_chains_and_survive_a_sigkill(tmp_path, strategy):
    """retry.ahead: a retry's own retry (a draw afresh: under grow, the next budget; under continue_then_grow, the
    one a continuation cut off again gets) starts beside it as a spare once the engine has room, kept only when the
    retry is cut off too. A full run uses spares and publishes consistent chains; a run SIGKILLed once a third
    attempt is committed loses nothing, and its rerun publishes every item once with each chain as it would be
    without spares. The engine's front end runs in a process of its own, as on every GPU: spares are promoted and
    withdrawn across its socket."""
    job = product_job(tmp_path, ITEMS, sampling={"max_tokens": 4},
                      retry={"max_passes": 2, "growth_factor": 2, "ahead": True, "strategy": strategy},
                      chunk_size=1, commit_seconds=3600, engine={"max_num_seqs": 16, "front_end_process": True})
    ids = list(pd.read_csv(tmp_path / "products.csv", dtype=str)["product_id"])
    job["output"]["dir"] = str(tmp_path / "full")
    process, log = start_run(tmp_path, job)
    assert process.wait(timeout=900) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert " started ahead;" in text, text[-3000:]  # the generate task's line: spares were started
    check_exactly_once(tmp_path / "full", ids)
    full = pd.read_parquet(tmp_path / "full" / "current" / "attempts" / "attempts.parquet")
    check_chains(full, 4, 2)
    strategies = {int(k): set(v) for k, v in full.groupby("attempt")["strategy"]}
    assert strategies[2] == {"continue" if strategy == "continue_then_grow" else "grow"} and strategies[3] == {"grow"}

    out = tmp_path / "out"
    job["output"]["dir"] = str(out)
    process, log = start_run(tmp_path, job)
    wait_for_attempt(process, out, 3, log)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    before = committed_attempts(out)
    assert not (out / "current").exists()
    rerun, log = start_run(tmp_path, job)
    assert rerun.wait(timeout=900) == 0, log.read_text()[-3000:]
    check_exactly_once(out, ids)
    manifest = json.loads((out / "current" / "manifest.json").read_text())
    assert manifest["counts"]["reused"] >= len(before)  # every committed attempt, none generated twice
    check_chains(pd.read_parquet(out / "current" / "attempts" / "attempts.parquet"), 4, 2)
