"""The batch flow's windows (flows.batch_generation): how a run's items are cut into windows, and the first window
building its prompts before the others."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest

import flows.batch_generation
from batchgen.records import Attempt, columns_of
from flows.batch_generation import (
    RAMP,
    WINDOWS_HELD_PER_PLACE,
    WINDOWS_HELD_PER_PLACE_NO_RETRIES,
    FeedingWindows,
    AttemptValidations,
    FirstPromptsFirst,
    in_parallel,
    item_windows,
    validate_attempts,
    window_workers,
)
from tasks.validate import Validated
from tests.publications import generated


def widths(bounds: list[tuple[int, int]]) -> list[int]:
    return [stop - start for start, stop in bounds]


def test_windows_of_one_at_a_time_are_full_windows_and_the_rest():
    assert item_windows(10000, 2048) == [(0, 2048), (2048, 4096), (4096, 6144), (6144, 8192), (8192, 10000)]
    assert item_windows(20, 6) == [(0, 6), (6, 12), (12, 18), (18, 20)]
    assert item_windows(0, 2048) == item_windows(0, 2048, ramp=True) == [(0, 0)]  # rejections only


def test_overlapping_windows_ramp_up_at_the_start_and_down_at_the_end():
    assert widths(item_windows(10000, 2048, ramp=True)) == [256, 512, 1024, 1604, 1604, 1604, 1604, 1024, 512, 256]
    assert widths(item_windows(3584, 2048, ramp=True)) == [256, 512, 1024, 1024, 512, 256]
    # the middle shares its items evenly: no small window left over between full ones or at the end
    assert widths(item_windows(20000, 2048, ramp=True)) == [256, 512, 1024] + [1824] * 9 + [1024, 512, 256]
    assert widths(item_windows(5000, 1000, ramp=True)) == [256, 512, 866, 866, 866, 866, 512, 256]


def test_without_the_ramp_down_the_windows_after_the_ramp_up_are_full_to_the_end():
    assert widths(item_windows(10000, 2048, ramp=True, ramp_down=False)) == [256, 512, 1024, 1642, 1642, 1642, 1641,
                                                                             1641]
    assert widths(item_windows(20000, 2048, ramp=True, ramp_down=False)) == [256, 512, 1024, 2024] + [2023] * 8
    assert widths(item_windows(1000, 2048, ramp=True, ramp_down=False)) == [256, 744]
    assert item_windows(1000, 200, ramp=True, ramp_down=False) == item_windows(1000, 200)


def test_a_small_run_gets_no_window_smaller_than_a_ramps():
    assert widths(item_windows(100, 2048, ramp=True)) == [100]
    assert widths(item_windows(511, 2048, ramp=True)) == [511]
    assert widths(item_windows(600, 2048, ramp=True)) == [256, 344]
    assert widths(item_windows(1000, 2048, ramp=True)) == [256, 488, 256]


def test_windows_no_larger_than_a_ramp_do_not_ramp():
    assert item_windows(1000, 200, ramp=True) == item_windows(1000, 200)
    assert item_windows(1000, RAMP, ramp=True) == item_windows(1000, RAMP)


@pytest.mark.parametrize("size", [1, 7, 255, 256, 300, 512, 1000, 2048, 4096])
@pytest.mark.parametrize("ramp, ramp_down", [(False, True), (True, True), (True, False)])
def test_windows_cover_every_item_once_in_order_and_none_is_larger_than_the_window_size(size, ramp, ramp_down):
    for count in [1, 2, 255, 256, 257, 511, 512, 513, 1000, 1791, 1792, 3583, 3584, 3585, 10000, 33333]:
        bounds = item_windows(count, size, ramp=ramp, ramp_down=ramp_down)
        assert bounds[0][0] == 0 and bounds[-1][1] == count
        assert all(stop == next_start for (_, stop), (next_start, _) in zip(bounds, bounds[1:]))
        assert all(0 < width <= size for width in widths(bounds)), (count, size, widths(bounds))
        if ramp and size > RAMP and count >= 2 * RAMP:  # a small first window; a small last one too with room
            assert widths(bounds)[0] == RAMP, widths(bounds)
            assert count < 3 * RAMP or not ramp_down or widths(bounds)[-1] == RAMP, widths(bounds)


def run_in_threads(work, indexes):
    threads = [threading.Thread(target=work, args=(index,)) for index in indexes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)


def test_the_first_window_builds_its_prompts_before_any_other_window_starts_on_its_own():
    turns, events, lock = FirstPromptsFirst(), [], threading.Lock()
    both_inside = threading.Barrier(2, timeout=10)

    def window(index: int) -> None:
        with turns.turn(index):
            with lock:
                events.append(("start", index))
            if index == 1:
                time.sleep(0.05)
            else:
                both_inside.wait()  # windows 2 and 3 build theirs side by side
            with lock:
                events.append(("end", index))

    run_in_threads(window, [3, 2, 1])  # started in any order
    assert events[:2] == [("start", 1), ("end", 1)]
    assert sorted(events[2:]) == [("end", 2), ("end", 3), ("start", 2), ("start", 3)]


def test_a_first_window_whose_prompts_fail_still_lets_the_others_go_on():
    turns, built = FirstPromptsFirst(), []

    def window(index: int) -> None:
        try:
            with turns.turn(index):
                if index == 1:
                    raise ValueError("a bad template")
                built.append(index)
        except ValueError:
            pass

    run_in_threads(window, [2, 1])
    assert built == [2]


def test_feeding_windows_take_their_slots_in_order_and_a_window_gives_its_slot_back_early():
    feeding = FeedingWindows(2)
    order: list[str] = []
    released = {index: threading.Event() for index in range(1, 5)}  # window i has had its first pass
    ended = {index: threading.Event() for index in range(1, 5)}  # window i may end

    def window(index: int) -> None:
        with feeding.slot(index) as first_pass_done:
            order.append(f"start {index}")
            released[index].wait(10)
            first_pass_done()
            first_pass_done()  # once is enough
            ended[index].wait(10)
        order.append(f"end {index}")

    threads = [threading.Thread(target=window, args=(index,)) for index in (4, 3, 2, 1)]  # started out of order
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    assert order == ["start 1", "start 2"]  # two slots, in the windows' order
    released[1].set()  # window 1's first pass is done, its retries go on: window 3 starts beside it
    time.sleep(0.2)
    assert order == ["start 1", "start 2", "start 3"]
    for index in (2, 3, 4):
        released[index].set()
    for event in ended.values():
        event.set()
    for thread in threads:
        thread.join(10)
    assert [event for event in order if event.startswith("start")] == ["start 1", "start 2", "start 3", "start 4"]
    assert len(order) == 8


def test_a_window_that_fails_gives_its_slot_back():
    feeding = FeedingWindows(1)
    with pytest.raises(RuntimeError):
        with feeding.slot(1):
            raise RuntimeError("window 1 failed")
    with feeding.slot(2):  # would wait forever if window 1 kept its slot
        pass


def test_windows_in_their_retries_do_not_keep_the_next_ones_from_a_free_place():
    """Three places; every window leaves its place once its first pass is done, then its retries take long. The
    windows after the first six still get a free place while the first ones are in their retries (with two threads
    per place, window 7 waited for a whole window to be staged: on the H200 the engine lost its first-pass work)."""
    places, windows = 3, 12  # four windows per place: more than two threads per place hold
    feeding, lock = FeedingWindows(places), threading.Lock()
    fed: list[int] = []
    retries_end = threading.Event()  # the long retry chains of every window end together, at the end

    def window(index: int) -> None:
        with feeding.slot(index) as first_pass_done:
            with lock:
                fed.append(index)
            first_pass_done()
            if index < windows:
                retries_end.wait(30)
        if index == windows:  # the last window had its place: everything before it is in its retries
            retries_end.set()

    started = time.monotonic()
    in_parallel(window, list(range(1, windows + 1)), workers=window_workers(places))
    assert fed == list(range(1, windows + 1))
    assert time.monotonic() - started < 10  # no window waited for another's retries to end
    assert window_workers(1) == WINDOWS_HELD_PER_PLACE  # on CPU builds too: one place, its windows' retries beside
    # a job without retries holds fewer: its windows only validate and stage once they have left their places
    assert window_workers(places, retries=False) == WINDOWS_HELD_PER_PLACE_NO_RETRIES * places < windows


def test_without_retries_two_windows_per_place_are_held_while_staging_is_the_slower_part():
    """Retries off, the host's work slower than the engine: windows that have left their places wait for the cores,
    each holding its rows; at most two per place are held at once, and every window still runs, in order."""
    places, windows = 3, 12
    feeding, lock = FeedingWindows(places), threading.Lock()
    fed: list[int] = []
    held, most = 0, 0

    def window(index: int) -> None:
        nonlocal held, most
        with lock:
            held += 1
            most = max(most, held)
        with feeding.slot(index) as first_pass_done:
            fed.append(index)
            first_pass_done()
        time.sleep(0.2)  # validation and staging
        with lock:
            held -= 1

    in_parallel(window, list(range(1, windows + 1)), workers=window_workers(places, retries=False),
                started=lambda index, timeout: feeding.taken(index, timeout))
    assert fed == list(range(1, windows + 1))
    assert places < most <= WINDOWS_HELD_PER_PLACE_NO_RETRIES * places


def test_window_threads_are_made_as_windows_take_their_places_not_all_at_once():
    feeding, lock = FeedingWindows(2), threading.Lock()
    fed: list[int] = []
    threads: set[int] = set()

    def window(index: int) -> None:
        with feeding.slot(index) as first_pass_done:
            with lock:
                fed.append(index)
                threads.add(threading.get_ident())
            first_pass_done()

    in_parallel(window, list(range(1, 9)), workers=16, started=lambda index, timeout: feeding.taken(index, timeout))
    assert fed == list(range(1, 9))
    # each window is handed on once the one before it has its place, so a thread that has finished its window
    # takes the next: a few threads, where handing all eight at once made eight
    assert len(threads) <= 4


def test_a_window_that_fails_before_its_place_stops_the_rest_without_waiting_for_it():
    feeding, ran = FeedingWindows(2), []

    def window(index: int) -> None:
        if index == 2:
            raise ValueError("window 2 failed before its place")
        with feeding.slot(index):
            ran.append(index)

    started = time.monotonic()
    with pytest.raises(ValueError, match="before its place"):
        in_parallel(window, [1, 2, 3, 4, 5], workers=8, started=lambda index, timeout: feeding.taken(index, timeout))
    assert ran == [1]  # the windows after it never started
    assert time.monotonic() - started < 5


def test_a_windows_place_taken_is_seen_by_the_hand_on():
    feeding = FeedingWindows(1)
    assert not feeding.taken(1, 0.01)
    with feeding.slot(1):
        assert feeding.taken(1, 0.01)
        assert not feeding.taken(2, 0.01)


class Validations:
    """flows.batch_generation.validate_task stood in: records the attempts each call validated (pure logic here;
    the flow's validation on the real engine: tests/e2e/test_engine_end_to_end.py)."""

    def __init__(self, fail: bool = False, seconds: float = 0.0):
        self.calls: list[tuple[str, list[tuple[str, int]]]] = []
        self.threads: dict[str, str] = {}  # label -> the thread that validated it
        self.fail, self.seconds = fail, seconds

    def __call__(self, spec, rows, keywords, label):
        rows = getattr(rows, "unquote", lambda: rows)()
        self.threads[label] = threading.current_thread().name
        time.sleep(self.seconds)
        self.calls.append((label, list(zip(rows["item_id"], rows["attempt"]))))
        if self.fail:
            raise ValueError("the suite failed to run")
        return Validated(rows=rows.assign(passed=True, failed=[[] for _ in range(len(rows))]), result={}, seconds=0.0)


def window_rows(items: int, retried: int) -> list[Attempt]:
    """First attempts of `items` items, then second attempts of the first `retried`."""
    return ([row for i in range(items) for row in generated(f"i{i}", ["cut"], ["length"])]
            + [row for i in range(retried) for row in generated(f"i{i}", ["a whole text"], attempt=2)])


def window_attempts(rows: list[Attempt], attempt: int) -> list[Attempt]:
    return [row for row in rows if row.attempt == attempt]


def test_each_attempt_number_is_validated_once_in_the_background_and_the_rest_after_the_task(monkeypatch):
    validations = Validations(seconds=0.2)  # the first two run at the same time
    monkeypatch.setattr(flows.batch_generation, "validate_task", validations)
    released: list[int] = []
    window = SimpleNamespace(label="w3", keywords=lambda spec: None)
    ahead = AttemptValidations(None, window, lambda: released.append(1))
    rows = window_rows(4, 2) + [row for row in generated("i0", ["longer still"], attempt=3)]
    ahead.requests_done(rows[:5])  # the four first attempts and one retry that came before the last of them
    ahead.attempt_done(1, window_attempts(rows, 1))
    ahead.requests_done(rows[:5])  # a generate task retried by Prefect says it again
    ahead.attempt_done(1, window_attempts(rows, 1))
    ahead.attempt_done(2, window_attempts(rows, 2))  # attempt 3 is left to the window's thread
    validated: list[Validated] = []
    validate_attempts(None, window, pd.DataFrame(columns_of(rows, Attempt)), validated, ahead.results())
    assert released == [1, 1]  # the slot is given back (once is enough: FeedingWindows)
    assert sorted(validations.calls) == [("w3", [("i0", 1), ("i1", 1), ("i2", 1), ("i3", 1)]),  # once each
                                         ("w3-retry1", [("i0", 2), ("i1", 2)]),
                                         ("w3-retry2", [("i0", 3)])]
    assert validations.threads == {"w3": "batchgen-validate-w3", "w3-retry1": "batchgen-validate-w3-retry1",
                                   "w3-retry2": threading.current_thread().name}  # the last one after the task
    assert [len(v.rows) for v in validated] == [4, 2, 1]  # in attempt order


def test_a_window_without_attempts_validates_nothing_ahead():
    window = SimpleNamespace(label="w1", keywords=lambda spec: None)
    nothing = AttemptValidations(None, window, lambda: None)
    nothing.requests_done([])  # a window of rejected rows only: nothing to validate ahead
    nothing.attempt_done(1, [])
    assert nothing.results() == {}


def test_a_validation_that_failed_in_the_background_is_raised_in_the_window(monkeypatch):
    monkeypatch.setattr(flows.batch_generation, "validate_task", Validations(fail=True))
    window = SimpleNamespace(label="w1", keywords=lambda spec: None)
    ahead = AttemptValidations(None, window, lambda: None)
    ahead.attempt_done(1, window_rows(2, 0))
    with pytest.raises(ValueError, match="the suite failed to run"):
        ahead.results()


def test_an_attempt_number_validated_on_other_attempts_than_the_task_returned_is_an_error(monkeypatch):
    monkeypatch.setattr(flows.batch_generation, "validate_task", Validations())
    window = SimpleNamespace(label="w2", keywords=lambda spec: None)
    ahead = AttemptValidations(None, window, lambda: None)
    ahead.attempt_done(1, window_rows(2, 0))
    with pytest.raises(RuntimeError, match="attempt 1 was validated on 2 attempts, the generate task returned 3"):
        validate_attempts(None, window, pd.DataFrame(columns_of(window_rows(3, 0), Attempt)), [], ahead.results())
