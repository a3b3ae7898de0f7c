"""The batch flow's windows (flows.batch_generation): how a run's items are cut into windows, and the first window
building its prompts before the others."""

from __future__ import annotations

import threading
import time

import pytest

from flows.batch_generation import (
    RAMP,
    WINDOWS_HELD_PER_PLACE,
    FeedingWindows,
    FirstPromptsFirst,
    in_parallel,
    item_windows,
    window_workers,
)


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


def test_a_small_run_gets_no_window_smaller_than_a_ramps():
    assert widths(item_windows(100, 2048, ramp=True)) == [100]
    assert widths(item_windows(511, 2048, ramp=True)) == [511]
    assert widths(item_windows(600, 2048, ramp=True)) == [256, 344]
    assert widths(item_windows(1000, 2048, ramp=True)) == [256, 488, 256]


def test_windows_no_larger_than_a_ramp_do_not_ramp():
    assert item_windows(1000, 200, ramp=True) == item_windows(1000, 200)
    assert item_windows(1000, RAMP, ramp=True) == item_windows(1000, RAMP)


@pytest.mark.parametrize("size", [1, 7, 255, 256, 300, 512, 1000, 2048, 4096])
@pytest.mark.parametrize("ramp", [False, True])
def test_windows_cover_every_item_once_in_order_and_none_is_larger_than_the_window_size(size, ramp):
    for count in [1, 2, 255, 256, 257, 511, 512, 513, 1000, 1791, 1792, 3583, 3584, 3585, 10000, 33333]:
        bounds = item_windows(count, size, ramp=ramp)
        assert bounds[0][0] == 0 and bounds[-1][1] == count
        assert all(stop == next_start for (_, stop), (next_start, _) in zip(bounds, bounds[1:]))
        assert all(0 < width <= size for width in widths(bounds)), (count, size, widths(bounds))
        if ramp and size > RAMP and count >= 2 * RAMP:  # a small first window; a small last one too with room
            assert widths(bounds)[0] == RAMP and (count < 3 * RAMP or widths(bounds)[-1] == RAMP), widths(bounds)


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
