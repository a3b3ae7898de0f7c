"""Job-level progress: items done of the job's total across windows and retry passes, as a line off a terminal."""

from __future__ import annotations

import io

from batchgen.progress import JobProgress, duration, for_run, tracked, window_of


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_items_across_windows_and_retry_passes_off_a_terminal():
    clock, out = Clock(), io.StringIO()
    progress = JobProgress("products", 10, stream=out, tty=False, every=30, clock=clock)
    progress.window("w1", 6)
    progress.window("w2", 4)
    clock.now += 20  # the engine starts: nothing yet, and no line before 30 s
    progress.committed("w1", 0, 0)
    assert lines(out) == []
    clock.now += 10
    progress.tick()
    assert lines(out) == ["products: 0/10 items (0%), no new output yet, 30 s elapsed"]

    progress.committed("w1", 4, 400)  # 4 of 6 outputs final, 2 cut off (they go to a retry pass)
    clock.now += 10
    progress.committed("w1-retry1".split("-retry")[0], 1, 100)  # one retried output now final
    assert progress.done() == 5
    clock.now += 20
    progress.tick()  # 30 s after the last line: 5 of 10, 500 tokens in 30 s since the first output
    assert lines(out)[-1] == "products: 5/10 items (50%), 17 output tokens/s, ETA 30 s, 1m00s elapsed"

    progress.staged_window("w1", 6)  # the item still cut off after the last pass is final too
    progress.committed("w1", 3, 0)  # a late report of a staged window changes nothing
    assert progress.done() == 6
    progress.committed("w2", 9, 10)  # never more than the window's items
    assert progress.done() == 10
    progress.close()
    assert lines(out)[-1].startswith("products: 10/10 items (100%), ")
    assert "ETA" not in lines(out)[-1]
    progress.close()
    assert len(lines(out)) == 3  # closed once


def test_candidates_count_as_one_item_and_reused_results_do_not_set_the_rate():
    clock, out = Clock(), io.StringIO()
    progress = JobProgress("job", 4, candidates=3, stream=out, tty=False, every=30, clock=clock)
    progress.window("all", 4)
    progress.committed("all", 6, 0)  # reused results of 2 items: no tokens, no rate
    assert progress.done() == 2 and progress.rate() is None and progress.eta() is None
    progress.committed("all", 5, 50)
    assert progress.done() == 3


def test_a_terminal_gets_one_bar_and_the_run_is_found_by_its_output_folder():
    out = io.StringIO()
    progress = JobProgress("job", 3, stream=out, tty=True, every=30)
    with tracked("/out/a", progress):
        assert for_run("/out/a") is progress and for_run("/out/b") is None
        progress.window("all", 3)
        progress.committed("all", 3, 30)
    assert for_run("/out/a") is None
    assert "3/3 items" in out.getvalue()


def test_labels_and_durations():
    assert window_of("w3-retry2") == "w3" and window_of("all") == "all"
    assert [duration(s) for s in (None, 12, 245, 7380)] == ["?", "12 s", "4m05s", "2h03m"]


def test_rates_count_from_when_the_engine_began_generating():
    clock, out = Clock(), io.StringIO()
    progress = JobProgress("job", 10, stream=out, tty=False, every=30, clock=clock)
    progress.window("all", 10)
    clock.now += 40  # the engine's start: not in the rate
    progress.generating()
    clock.now += 10
    progress.committed("all", 5, 100)  # the first commit: 100 tokens in the 10 s since generation began
    assert progress.rate() == 10.0 and progress.eta() == 10.0
