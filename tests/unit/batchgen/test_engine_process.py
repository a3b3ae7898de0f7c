"""The engine's front end in a process of its own: a real child process and socket, a stand-in engine in it
(tests.engines.ProcessStandInLLM). The real engine behind it: tests/e2e/test_crash_recovery.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from types import SimpleNamespace

import pytest

from batchgen.engine_process import Logprob, ProcessEngine, plain_output
from batchgen.generation import top_logprobs
from batchgen.models import ModelRef
from batchgen.stream import StreamError
from tests.conftest import ROOT
from tests.engines import aborted_requests, fail, priorities_given, process_id, step_sizes, thread_names

FACTORY = "tests.engines:ProcessStandInLLM"
MODEL = ModelRef(name="stand-in", path="/stand-in")


def start(**kwargs) -> ProcessEngine:
    return ProcessEngine(MODEL, {}, kwargs, factory=FACTORY)


def prompts(first: int, count: int) -> list[dict]:
    return [{"prompt_token_ids": [first + i, 1, 2]} for i in range(count)]


@pytest.fixture
def engine():
    started = start(per_step=3, seconds=0.01)
    yield started
    started.close()


def test_each_submitter_gets_its_own_outputs_from_the_engine_process(engine):
    assert engine.max_model_len == 2048 and engine.dtype == "float32"
    got: dict[str, list[str]] = {}

    def submit(name: str, first: int, count: int) -> None:
        submission = engine.stream.submit(prompts(first, count), [None] * count)
        got[name] = [o.outputs[0].text for _, o in sorted((p for b in submission.batches(4, 0.05) for p in b),
                                                         key=lambda pair: pair[0])]
        assert submission.first_added_at <= submission.last_output_at <= time.perf_counter()

    threads = [threading.Thread(target=submit, args=("a", 100, 10)), threading.Thread(target=submit, args=("b", 200, 7))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert got == {"a": [f"out {100 + i}" for i in range(10)], "b": [f"out {200 + i}" for i in range(7)]}
    assert engine.stream.submit([], []).total == 0  # nothing to send: done at once


def test_joined_requests_cross_the_socket_into_their_parents_reader(engine):
    submission = engine.stream.submit(prompts(0, 3), [None] * 3)
    read = []
    for batch in submission.batches(2, 0.05):
        for index, output in batch:
            read.append((index, output.outputs[0].text))
            if index < 3:  # a follow-up of each of the first requests, in the same submission
                engine.stream.submit(prompts(100 + index, 1), [None], into=submission)
    assert submission.total == submission.received == 6
    texts = dict(read)
    assert sorted(texts) == list(range(6))
    assert sorted(texts[i] for i in range(3, 6)) == ["out 100", "out 101", "out 102"]
    assert sorted(texts[i] for i in range(3)) == ["out 0", "out 1", "out 2"]


def test_request_priorities_cross_the_socket(engine):
    plain = engine.stream.submit(prompts(0, 2), [None] * 2)
    ranked = engine.stream.submit(prompts(10, 3), [None] * 3, priorities=[0, -1, -2])
    assert len(list(plain)) == 2 and len(list(ranked)) == 3
    assert engine.run(priorities_given) == [0, 0, 0, -1, -2]
    feed = engine.feed()  # the engine process's stream's counters, read across the socket
    assert feed["steps"] >= 2 and feed["busy_seconds"] > 0 and feed["request_seconds"] > 0


def test_the_engine_process_streams_requests_added_per_step_can_be_set_between_runs():
    """benchmarks.run --flow-variants compares the stream's requests added per step on one engine: set across the
    socket, it takes effect for the next submission, and the setting it replaced comes back."""
    from benchmarks.run import set_add_per_step
    from batchgen.stream import ADD_PER_STEP

    engine = start(per_step=None, seconds=0.01)  # each step answers every request added before it
    try:
        assert set_add_per_step(engine, 2) == ADD_PER_STEP
        assert len(list(engine.stream.submit(prompts(0, 5), [None] * 5))) == 5
        assert engine.run(step_sizes) == [2, 2, 1]
        assert set_add_per_step(engine, 1_000_000) == 2
        assert len(list(engine.stream.submit(prompts(10, 5), [None] * 5))) == 5
        assert engine.run(step_sizes)[3:] == [5]
    finally:
        engine.close()


def test_calls_run_in_the_engine_process_and_their_errors_come_back(engine):
    assert engine.run(process_id) == engine.process.pid != os.getpid()
    with pytest.raises(ValueError, match="boom"):
        engine.run(fail, "boom")
    with pytest.raises(AttributeError, match="front_end_process"):
        engine.llm  # noqa: B018
    with pytest.raises(TypeError, match="not importable"):  # a function the engine process could not import
        engine.run(lambda llm: 1)
    assert engine.run(process_id) == engine.process.pid  # the engine process goes on


def test_cancel_takes_the_rest_out_of_the_engine(engine):
    slow = start(per_step=1, seconds=0.2)
    try:
        submission = slow.stream.submit(prompts(0, 20), [None] * 20)
        first = next(iter(submission))
        submission.cancel()
        aborted = slow.run(aborted_requests)  # runs once the engine is idle: after the abort
        assert first[1].outputs[0].text == f"out {first[0]}"
        assert len(aborted) >= 15
        deadline = time.monotonic() + 10  # its forwarder in the engine process stops too
        while [name for name in slow.run(thread_names) if name.startswith("batchgen-forward")]:
            assert time.monotonic() < deadline, "the cancelled submission's forwarder is still waiting"
            time.sleep(0.1)
    finally:
        slow.close()


def test_a_dead_engine_process_reaches_every_waiting_submitter():
    engine = start(per_step=1, seconds=0.2)
    submission = engine.stream.submit(prompts(0, 50), [None] * 50)
    os.kill(engine.process.pid, signal.SIGKILL)
    with pytest.raises(StreamError, match="engine process exited"):
        list(submission)
    assert not engine.stream.alive
    with pytest.raises(StreamError, match="engine process exited"):
        engine.stream.submit(prompts(0, 1), [None])
    engine.close()  # nothing left to stop: returns at once
    assert engine.process.returncode == -signal.SIGKILL


def test_close_stops_the_engine_process():
    """Also after Ctrl-C reached it with the rest of the terminal's process group: it stops when the run says."""
    engine = start()
    os.kill(engine.process.pid, signal.SIGINT)
    assert engine.run(process_id) == engine.process.pid  # still serving
    started = time.monotonic()
    engine.close()
    assert engine.process.returncode == 0 and time.monotonic() - started < 10


def test_the_engine_process_exits_when_the_run_is_gone():
    """The run's process died (its end of the socket closed, no stop said): the engine process stops itself."""
    parent, child = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-m", "batchgen.engine_process", str(child.fileno())],
                               pass_fds=(child.fileno(),), cwd=ROOT)
    child.close()
    conn = Connection(parent.detach())
    conn.send(("start", FACTORY, {}))
    assert conn.recv()[0] == "ready"
    conn.close()
    assert process.wait(timeout=30) == 0


def test_an_engine_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match="could not start: ValueError: no such model"):
        start(fail=True)


def test_outputs_cross_as_plain_tuples_with_what_batchgen_reads():
    logprob = SimpleNamespace(logprob=-0.25, rank=1, decoded_token="Hi")
    output = SimpleNamespace(
        request_id=7, prompt_logprobs=[None, {3: logprob}],
        outputs=[SimpleNamespace(index=1, text="Hi", token_ids=(5, 6), cumulative_logprob=-1.5, finish_reason="stop",
                                 stop_reason="\n\n", logprobs=[{5: logprob, 9: SimpleNamespace(
                                     logprob=-3.0, rank=2, decoded_token="x")}])])
    plain = plain_output(output)
    assert plain.request_id == "7" and plain.finished
    [completion] = plain.outputs
    assert (completion.index, completion.text, completion.token_ids, completion.cumulative_logprob,
            completion.finish_reason, completion.stop_reason) == (1, "Hi", [5, 6], -1.5, "stop", "\n\n")
    assert completion.logprobs[0][5] == Logprob(-0.25, 1, "Hi")
    # the published logprob rows are the same from the plain tuples as from vLLM's objects
    assert top_logprobs(completion.logprobs) == top_logprobs(output.outputs[0].logprobs)
    assert top_logprobs(plain.prompt_logprobs) == top_logprobs(output.prompt_logprobs)


def test_spare_requests_are_withdrawn_and_promoted_across_the_socket():
    slow = start(per_step=1, seconds=0.05, max_num_seqs=8)  # room for a spare: fewer than 2 requests held
    try:
        main = slow.stream.submit(prompts(0, 4), [None] * 4)
        withdrawn = slow.stream.submit(prompts(100, 1), [None], into=main, spare=True)
        promoted = slow.stream.submit(prompts(200, 1), [None], into=main, spare=True)
        got = {}
        for batch in main.batches(1, 0.01):
            for index, output in batch:
                assert index not in got
                got[index] = None if output is None else output.outputs[0].text
                if index == 0:
                    withdrawn.withdraw()  # still waiting for room: it never runs
                    promoted.promote()
        assert got == {0: "out 0", 1: "out 1", 2: "out 2", 3: "out 3", 4: None, 5: "out 200"}
        assert main.received == main.total == 6
    finally:
        slow.close()


def test_retries_started_ahead_run_through_the_engine_process():
    """run_requests with retry.ahead on an engine in a process of its own (as on every GPU): a retry's own retry
    is sent as a spare, adopted or withdrawn across the socket, and the rows are those of the chain without it."""
    from batchgen.generation import run_requests
    from batchgen.job import RetrySpec, SamplingSpec
    from batchgen.records import GenRequest
    from batchgen.retry import stream_retry

    requests = [GenRequest(item_id=f"p{i}", prompt=f"p{i}", prompt_token_ids=[1000 + i, 7], max_tokens=4)
                for i in range(6)]

    def run(ahead: bool):
        engine = start(per_step=2, seconds=0.01, max_num_seqs=16, fits=16)  # 4 and 8 cut off, 16 fits
        try:
            ran = run_requests(lambda: engine, requests, SamplingSpec(max_tokens=4), "stand-in", commit_every=1,
                               follow_up=stream_retry(RetrySpec(max_passes=3, ahead=ahead), 2048))
            return ran, engine.run(aborted_requests)
        finally:
            engine.close()

    plain, _ = run(ahead=False)
    ran, aborted = run(ahead=True)
    chain = sorted((r.item_id, r.attempt, r.max_tokens, r.finish_reason, r.request_key) for r in ran.rows)
    assert chain == sorted((r.item_id, r.attempt, r.max_tokens, r.finish_reason, r.request_key) for r in plain.rows)
    assert sorted((r.item_id, r.attempt, r.max_tokens) for r in ran.rows) == sorted(
        (f"p{i}", a, b) for i in range(6) for a, b in ((1, 4), (2, 8), (3, 16)))
    assert ran.spares_kept == 6  # each 16 was started beside its 8
    assert ran.spares_dropped == 6  # and each 32 beside its 16, not needed
    assert (plain.spares_kept, plain.spares_dropped) == (0, 0)


def test_the_engine_process_takes_its_thread_switch_interval_from_the_environment(monkeypatch, caplog):
    """BATCHGEN_ENGINE_SWITCH_INTERVAL reaches the engine's process (a real child, started with the run's environment)
    before it builds the engine; a value that is not a number of seconds below 1 is said and left out."""
    from batchgen.engine_process import SWITCH_INTERVAL_ENV, switch_interval, switch_interval_from_env

    monkeypatch.setenv(SWITCH_INTERVAL_ENV, "0.0005")
    child = start(per_step=None, seconds=0.01)
    try:
        assert child.run(switch_interval) == 0.0005
    finally:
        child.close()
    before = sys.getswitchinterval()
    for wrong in ("5", "-1", "fast"):
        monkeypatch.setenv(SWITCH_INTERVAL_ENV, wrong)
        assert switch_interval_from_env() is None
        assert f"{SWITCH_INTERVAL_ENV}={wrong!r} is not a number of seconds between 0 and 1" in caplog.text
    assert sys.getswitchinterval() == before
