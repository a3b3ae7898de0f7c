"""The engine stream: many submitters, one engine, outputs routed back as they finish (stand-in engine core)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from batchgen.stream import EngineStream, StreamError, feed_delta
from tests.engines import StandInCore


def answer(prompts, params):
    return [SimpleNamespace(outputs=[SimpleNamespace(index=0, text=f"out {p['prompt_token_ids'][0]}")])
            for p in prompts]


class SlowCore(StandInCore):
    """Answers `per_step` requests a step, `seconds` per step, and remembers which requests each step held."""

    def __init__(self, per_step: int, seconds: float = 0.0, fail_at_step: int | None = None,
                 max_num_seqs: int | None = None):
        super().__init__(answer, per_step, max_num_seqs)
        self.seconds, self.fail_at_step = seconds, fail_at_step
        self.steps: list[list[str]] = []

    def step(self):
        if self.fail_at_step is not None and len(self.steps) == self.fail_at_step:
            raise RuntimeError("engine died (stand-in)")
        self.steps.append([request_id for request_id, _, _ in self.pending[:self.per_step]])
        time.sleep(self.seconds)
        return super().step()


def prompts(first: int, count: int) -> list[dict]:
    return [{"prompt_token_ids": [first + i, 1, 2]} for i in range(count)]


def test_two_submitters_share_the_engine_and_each_gets_exactly_its_outputs():
    core = SlowCore(per_step=4, seconds=0.01)
    both_in = threading.Event()
    first_step = core.step

    def step():  # the first step waits until both submitters are in, so their order does not rest on timing
        both_in.wait(timeout=30)
        return first_step()

    core.step = step
    stream = EngineStream(core, add_per_step=64)
    got: dict[str, list[str]] = {}
    submitted = threading.Barrier(3, timeout=30)

    def submit(name: str, first: int):
        submission = stream.submit(prompts(first, 10), [None] * 10)
        submitted.wait()
        got[name] = [output.outputs[0].text for _, output in sorted(submission, key=lambda pair: pair[0])]

    threads = [threading.Thread(target=submit, args=("a", 100)), threading.Thread(target=submit, args=("b", 200))]
    for thread in threads:
        thread.start()
    submitted.wait()
    both_in.set()
    for thread in threads:
        thread.join(timeout=30)
    assert got["a"] == [f"out {100 + i}" for i in range(10)]
    assert got["b"] == [f"out {200 + i}" for i in range(10)]
    # The engine never ran dry between them: 20 requests, 4 a step, 5 steps (no step held fewer than 4).
    assert [len(step) for step in core.steps] == [4, 4, 4, 4, 4]
    stream.close()


@pytest.mark.parametrize("value, per_step, warned", [("20", [20], False), ("", [8, 8, 4], False),
                                                     ("all", [8, 8, 4], True), ("0", [8, 8, 4], True)])
def test_the_requests_added_per_step_follow_the_environment_where_it_names_a_positive_number(
        value, per_step, warned, monkeypatch, caplog):
    """BATCHGEN_STREAM_ADD_PER_STEP (benchmarks.run --add-per-step) sets the stream's default; anything else is
    said and left at the default (here 8)."""
    import batchgen.stream as stream_module

    monkeypatch.setattr(stream_module, "ADD_PER_STEP", 8)
    monkeypatch.setenv("BATCHGEN_STREAM_ADD_PER_STEP", value)
    core = SlowCore(per_step=1000)
    with caplog.at_level("WARNING", logger="batchgen.stream"):
        stream = EngineStream(core)
    submission = stream.submit(prompts(0, 20), [None] * 20)
    assert sorted(index for index, _ in submission) == list(range(20))
    assert [len(step) for step in core.steps] == per_step
    assert ("BATCHGEN_STREAM_ADD_PER_STEP" in caplog.text) == warned
    stream.close()


def test_a_large_submission_is_added_while_the_engine_already_steps():
    core = SlowCore(per_step=1000)
    stream = EngineStream(core, add_per_step=8)
    submission = stream.submit(prompts(0, 20), [None] * 20)
    assert sorted(index for index, _ in submission) == list(range(20))
    assert [len(step) for step in core.steps] == [8, 8, 4]  # the first step did not wait for all 20
    stream.close()


def test_batches_commit_by_count_and_by_time():
    core = SlowCore(per_step=3, seconds=0.05)
    stream = EngineStream(core)
    sizes = [len(batch) for batch in stream.submit(prompts(0, 10), [None] * 10).batches(4, 60.0)]
    assert sizes == [4, 4, 2]  # by count; the rest when the submission is done
    timed = [len(batch) for batch in stream.submit(prompts(0, 6), [None] * 6).batches(1000, 0.01)]
    assert sum(timed) == 6 and len(timed) >= 2  # by time: what had finished after 10 ms, then the rest
    stream.close()


def test_an_engine_failure_reaches_every_waiting_submitter_and_later_submits():
    core = SlowCore(per_step=2, seconds=0.01, fail_at_step=1)
    stream = EngineStream(core)
    first, second = stream.submit(prompts(0, 4), [None] * 4), stream.submit(prompts(10, 4), [None] * 4)
    received = []
    with pytest.raises(StreamError, match="engine died"):
        for index, _ in first:
            received.append(index)
    assert received == [0, 1]  # what finished before the failure reached its submitter
    with pytest.raises(StreamError, match="engine died"):
        list(second)
    assert not stream.alive
    with pytest.raises(StreamError, match="failed earlier"):
        stream.submit(prompts(0, 1), [None])


def test_cancel_takes_the_unfinished_requests_out_of_the_engine():
    core = SlowCore(per_step=1, seconds=0.02)
    stream = EngineStream(core)
    submission = stream.submit(prompts(0, 20), [None] * 20)
    for index, _ in submission:
        break
    submission.cancel()
    deadline = time.monotonic() + 10
    while core.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not core.pending and len(core.aborted) >= 15
    after = stream.submit(prompts(100, 2), [None] * 2)  # the stream goes on for others
    assert sorted(index for index, _ in after) == [0, 1]
    stream.close()


def test_a_call_runs_on_the_stream_thread_only_when_the_engine_is_idle():
    core = SlowCore(per_step=2, seconds=0.01)
    stream = EngineStream(core)
    submission = stream.submit(prompts(0, 10), [None] * 10)
    seen = stream.call(lambda: (threading.current_thread().name, len(core.pending)))
    assert seen == ("batchgen-engine-stream", 0)
    assert len(list(submission)) == 10
    with pytest.raises(ValueError, match="boom"):
        stream.call(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert stream.alive  # a failing call is the caller's error, not the engine's
    stream.close()


def test_closing_the_stream_fails_its_waiting_submitters_instead_of_leaving_them_waiting():
    core = SlowCore(per_step=1, seconds=0.05)
    stream = EngineStream(core)
    submission = stream.submit(prompts(0, 50), [None] * 50)
    stream.close()
    with pytest.raises(StreamError, match="shut down"):
        list(submission)
    assert not stream.alive


def follow_ups_of(stream: EngineStream, submission, first_follow_up: int) -> list[tuple[int, str]]:
    """Read `submission`; each output of the first 4 requests gets one follow-up request joined to it (its prompt
    first_follow_up + index). Returns (index, text) of everything read, in order."""
    read = []
    for batch in submission.batches(2, 0.05):
        for index, output in batch:
            read.append((index, output.outputs[0].text))
            if index < 4:
                stream.submit(prompts(first_follow_up + index, 1), [None], into=submission)
    return read


def test_joined_requests_come_through_their_parents_reader_indexed_after_its_requests():
    stream = EngineStream(SlowCore(per_step=3))
    submission = stream.submit(prompts(0, 4), [None] * 4)
    read = follow_ups_of(stream, submission, first_follow_up=100)
    # the parent's iterator waited for the joined requests too, each indexed after what was there when it joined
    assert submission.total == submission.received == 8
    assert sorted(index for index, _ in read) == list(range(8))
    by_text = {text: index for index, text in read}
    assert {text for text in by_text if text.startswith("out 10")} == {f"out {100 + i}" for i in range(4)}
    assert all(by_text[f"out {100 + i}"] >= 4 for i in range(4))
    assert submission.last_output_at >= max(child.last_output_at for child in submission.children)
    stream.close()


def test_cancel_takes_joined_requests_out_too():
    core = SlowCore(per_step=1, seconds=0.02)
    stream = EngineStream(core)
    submission = stream.submit(prompts(0, 2), [None] * 2)
    first = next(iter(submission))
    joined = stream.submit(prompts(100, 20), [None] * 20, into=submission)
    while not any(request_id in joined.ids for step in core.steps for request_id in step):
        time.sleep(0.01)  # the joined requests are in the engine
    submission.cancel()
    deadline = time.monotonic() + 10
    while core.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first[0] == 0 and not core.pending
    assert len(set(core.aborted) & set(joined.ids)) >= 15
    stream.close()


def test_priorities_reach_the_engine_and_lower_ones_run_first():
    """Retries go into the engine with a lower priority than first attempts (generation.retries_first): on an engine
    that schedules by priority, as vLLM's "priority" policy does, they run ahead of first attempts still waiting."""
    core = SlowCore(per_step=1)
    joined = threading.Event()
    plain_check = core.has_unfinished_requests

    def has_unfinished_requests():  # after the first step the stream waits for the follow-ups before it reads its
        if core.steps:              # inbox, so the order does not rest on timing
            joined.wait(timeout=30)
        return plain_check()

    core.has_unfinished_requests = has_unfinished_requests
    stream = EngineStream(core)
    submission = stream.submit(prompts(0, 8), [None] * 8)
    order = []
    for index, output in submission:
        order.append(output.outputs[0].text)
        if index == 0:  # follow-ups of the first output, as retries are, while 7 first attempts wait
            stream.submit(prompts(100, 2), [None] * 2, into=submission, priorities=[-1, -1])
            joined.set()
    assert order[:3] == ["out 0", "out 100", "out 101"]
    assert order[3:] == [f"out {i}" for i in range(1, 8)]
    assert [core.priorities[request_id] for request_id in submission.children[0].ids] == [-1, -1]
    assert {core.priorities[request_id] for request_id in submission.ids} == {0}
    stream.close()


def test_feed_counts_the_stepping_time_the_engine_held_a_full_batch():
    core = SlowCore(per_step=4, seconds=0.02)
    core.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=4))
    stream = EngineStream(core)
    before = stream.feed()
    assert before["capacity"] == 4
    assert len(list(stream.submit(prompts(0, 10), [None] * 10))) == 10
    feed = feed_delta(before, stream.feed())
    # three steps holding 10, 6 and 2 requests: the first two full (4 at once), the last not
    assert feed["steps"] == 3 and [len(step) for step in core.steps] == [4, 4, 2]
    assert 0.5 < feed["full_share"] < 0.8 and feed["full_seconds"] < feed["busy_seconds"]
    assert 4 < feed["mean_requests"] < 8
    # the steps by requests held (8-15, 4-7, 2-3), their seconds adding up to the stepping time
    assert {key: steps for key, (steps, _) in feed["by_held"].items()} == {8: 1, 4: 1, 2: 1}
    assert sum(seconds for _, seconds in feed["by_held"].values()) == pytest.approx(feed["busy_seconds"])
    middle = stream.feed()
    assert len(list(stream.submit(prompts(10, 3), [None] * 3))) == 3
    later = feed_delta(middle, stream.feed())  # only what came after the middle reading
    stream.close()
    assert {key: steps for key, (steps, _) in later["by_held"].items()} == {2: 1}


def test_a_batch_holding_an_urgent_output_is_handed_over_within_its_shorter_wait():
    core = SlowCore(per_step=1, seconds=0.05)
    stream = EngineStream(core)
    submission = stream.submit(prompts(0, 6), [None] * 6)
    started = time.monotonic()
    waits = []
    for batch in submission.batches(1000, 60.0, urgent=lambda index, output: output.outputs[0].text == "out 1",
                                    urgent_seconds=0.1):
        waits.append((sorted(index for index, _ in batch), time.monotonic() - started))
    stream.close()
    # the batch that got output 1 went out ~0.1 s later, not after 60 s; the rest when the submission was done
    first = waits[0]
    assert 1 in first[0] and first[1] < 5 and len(waits) >= 2
    assert sorted(i for indices, _ in waits for i in indices) == list(range(6))


def test_spare_requests_enter_the_engine_only_while_it_has_room_or_once_promoted():
    core = SlowCore(per_step=2, seconds=0.02, max_num_seqs=8)  # room for spares: fewer than 2 requests held
    held_when_added: dict[str, int] = {}
    add = core.add_request

    def add_request(request_id, *args, **kwargs):
        held_when_added[request_id] = len(core.pending)
        return add(request_id, *args, **kwargs)

    core.add_request = add_request
    stream = EngineStream(core)
    main = stream.submit(prompts(0, 6), [None] * 6)
    spare = stream.submit(prompts(100, 1), [None], into=main, spare=True)
    promoted = stream.submit(prompts(200, 1), [None], into=main, spare=True)
    seen = []
    for index, output in main:
        seen.append(output.outputs[0].text)
        if index == 0:
            promoted.promote()  # into the engine now, though it holds 4 requests
    assert sorted(seen) == sorted([f"out {i}" for i in range(6)] + ["out 100", "out 200"])
    assert held_when_added[promoted.ids[0]] >= 2
    assert held_when_added[spare.ids[0]] < 2  # only once the engine had room
    stream.close()


def test_withdrawn_requests_come_back_as_none_exactly_once_and_leave_the_engine():
    core = SlowCore(per_step=1, seconds=0.02, max_num_seqs=64)
    stream = EngineStream(core)
    main = stream.submit(prompts(0, 3), [None] * 3)
    early = stream.submit(prompts(100, 1), [None], into=main, spare=True)  # room: it runs at once
    late = stream.submit(prompts(200, 4), [None] * 4, into=main)
    got: dict[int, object] = {}
    for index, output in main:
        assert index not in got
        got[index] = output
        if index == 0:
            late.withdraw()  # most of it still waiting in the engine
        if index == 1:
            early.withdraw()  # finished already, or not: either its output or None comes, once
    assert sorted(got) == list(range(8)) and main.received == main.total == 8
    late_outputs = [got[i] for i in range(4, 8)]
    assert late_outputs.count(None) >= 2 and all(o is None or o.outputs[0].text.startswith("out 20")
                                                   for o in late_outputs)
    assert got[3] is None or got[3].outputs[0].text == "out 100"
    assert set(core.aborted) >= {late.ids[i] for i, o in enumerate(late_outputs) if o is None}
    assert not core.pending
    stream.close()


def test_an_idle_reader_sleeps_until_the_next_output():
    """A reader with nothing to hand over waits for the next output instead of waking every max_seconds: in the
    engine's process each submission has a reader, and readers woken every few ms take the interpreter from the
    engine's own loop."""
    core = SlowCore(per_step=1, seconds=0.3)  # an output every 0.3 s
    stream = EngineStream(core)
    submission = stream.submit(prompts(0, 2), [None] * 2)
    real, asked = submission._outputs, []

    class Counting:  # the submission's queue, counting the reader's waits
        def get(self, *args, **kwargs):
            asked.append(kwargs.get("timeout"))
            return real.get(*args, **kwargs)

        def get_nowait(self):
            asked.append(0)
            return real.get_nowait()

        def put(self, item):
            real.put(item)

    submission._outputs = Counting()
    batches = list(submission.batches(10, 0.01))
    assert sorted(index for batch in batches for index, _ in batch) == [0, 1]
    assert len(asked) <= 6  # about 0.6 s of waiting: a reader waking every 10 ms would have asked ~60 times
    stream.close()


def test_an_engine_that_does_not_say_how_many_it_runs_gets_spares_only_once_promoted():
    core = SlowCore(per_step=4, seconds=0.01)  # no max_num_seqs: room cannot be told
    stream = EngineStream(core)
    main = stream.submit(prompts(0, 2), [None] * 2)
    dropped = stream.submit(prompts(100, 1), [None], into=main, spare=True)
    kept = stream.submit(prompts(200, 1), [None], into=main, spare=True)
    outputs = iter(main)
    assert sorted(index for index, _ in (next(outputs), next(outputs))) == [0, 1]
    time.sleep(0.1)  # the engine idle, the spares still out of it
    assert not [request for step in core.steps for request in step if request.startswith(("bg1", "bg2"))]
    kept.promote()
    dropped.withdraw()
    rest = dict(next(outputs) for _ in range(2))
    assert rest[2] is None and rest[3].outputs[0].text == "out 200"
    stream.close()
