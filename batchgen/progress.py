"""The job's progress as a user follows it: items done of the job's total, across windows and retry passes.

One `JobProgress` per flow run. An item is done once its output is final: it finished without being cut off
(it will not be retried), or its window was staged (rejected rows, and outputs still cut off after the last
pass, included). Generation reports per commit, a window when it is staged: nothing here runs per item.

On a terminal it is one tqdm bar (items, output tokens/s, ETA); off a terminal (a log file, a CI job, a
worker) a plain line every `every` seconds, so a long first pass is never silent. tqdm is used because it
is already installed (vLLM and GX use it) and draws a bar that redraws in place, rate and ETA included.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

LINE_SECONDS = 30.0  # off a terminal: one line this often (BATCHGEN_PROGRESS_SECONDS changes it)
_RUNS: dict[str, JobProgress] = {}
_RUNS_LOCK = threading.Lock()


def duration(seconds: float | None) -> str:
    """12 s, 4m05s, 2h03m."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def window_of(label: str) -> str:
    """The window a generate task's label belongs to: `w3-retry2` -> `w3`."""
    return label.split("-retry", 1)[0]


class JobProgress:
    """Items done of `total` for one run; thread-safe (windows report from their own threads)."""

    def __init__(self, name: str, total: int, candidates: int = 1, stream: TextIO | None = None,
                 tty: bool | None = None, every: float | None = None, clock=time.monotonic):
        self.name, self.total, self.candidates = name, total, max(candidates, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = every if every is not None else float(os.environ.get("BATCHGEN_PROGRESS_SECONDS", LINE_SECONDS))
        self.clock = clock
        self.lock = threading.Lock()
        self.units: dict[str, int] = {}  # per window: finished candidates (capped at the window's)
        self.sizes: dict[str, int] = {}  # per window: its items
        self.staged: set[str] = set()
        self.tokens = 0
        self.started = clock()
        self.first_token_at: float | None = None  # generation began: rates and ETAs leave the engine's start out
        self.done_at_first_token = 0
        self.last_line = self.started
        self.closed = False
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=name, unit="item", file=self.stream, dynamic_ncols=True,
                            mininterval=0.5, smoothing=0.1, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} items "
                            "[{elapsed}<{remaining}{postfix}]")

    # ------------------------------------------------------------ reports

    def window(self, window: str, items: int) -> None:
        """A window of `items` items starts (its prompts are built)."""
        with self.lock:
            self.sizes[window] = items

    def generating(self) -> None:
        """The engine is there and requests go in: rates and ETAs count from the first such moment."""
        with self.lock:
            if self.first_token_at is None:
                self.first_token_at, self.done_at_first_token = self.clock(), self.done()

    def committed(self, window: str, finished: int, tokens: int) -> None:
        """A commit of generation: `finished` candidates ended without being cut off, `tokens` new output tokens."""
        with self.lock:
            if tokens and self.first_token_at is None:  # outputs without a known start: count from here on
                self.first_token_at, self.done_at_first_token = self.clock(), self.done()
            if window not in self.staged:
                cap = self.sizes.get(window, self.total) * self.candidates
                self.units[window] = min(cap, self.units.get(window, 0) + finished)
            self.tokens += tokens
            self._show()

    def staged_window(self, window: str, items: int) -> None:
        """A window's rows are staged: every one of its items is final."""
        with self.lock:
            self.staged.add(window)
            self.sizes[window] = items
            self.units[window] = items * self.candidates
            self._show()

    # ------------------------------------------------------------ figures

    def done(self) -> int:
        return min(self.total, sum(self.units.values()) // self.candidates)

    def rate(self) -> float | None:
        """Output tokens/s since generation began (the engine's start and reused results left out)."""
        if self.first_token_at is None:
            return None
        seconds = self.clock() - self.first_token_at
        return self.tokens / seconds if seconds > 0 else None

    def eta(self) -> float | None:
        """Seconds left at the rate items were finished since generation began."""
        if self.first_token_at is None:
            return None
        done, seconds = self.done() - self.done_at_first_token, self.clock() - self.first_token_at
        if done <= 0 or seconds <= 0:
            return None
        return (self.total - self.done()) * seconds / done

    def line(self) -> str:
        done, rate, eta = self.done(), self.rate(), self.eta()
        share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        speed = f", {rate:.0f} output tokens/s" if rate is not None else ", no new output yet"
        left = f", ETA {duration(eta)}" if eta is not None and done < self.total else ""
        return (f"{self.name}: {done}/{self.total} items{share}{speed}{left}, "
                f"{duration(self.clock() - self.started)} elapsed")

    # ------------------------------------------------------------ output

    def _show(self) -> None:
        if self.closed:
            return
        if self.bar is not None:
            done = self.done()
            if done != self.bar.n:
                self.bar.update(done - self.bar.n)
            rate = self.rate()
            if rate is not None:
                self.bar.set_postfix_str(f"{rate:.0f} tok/s", refresh=False)
            return
        now = self.clock()
        if now - self.last_line >= self.every:
            self.last_line = now
            self._write(self.line())

    def _write(self, line: str) -> None:
        # Not print(): inside a flow run with log_prints, Prefect turns print() into log records.
        self.stream.write(line + "\n")
        self.stream.flush()

    def tick(self) -> None:
        """Called on a timer: off a terminal, the line is due even when nothing was committed (engine start)."""
        with self.lock:
            self._show()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.bar is not None:
                self.bar.update(self.done() - self.bar.n)
                self.bar.close()
            else:
                self._write(self.line())


class _Ticker(threading.Thread):
    def __init__(self, progress: JobProgress, seconds: float):
        super().__init__(name="batchgen-progress", daemon=True)
        self.progress, self.seconds, self.stopped = progress, seconds, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.seconds):
            self.progress.tick()


class tracked:
    """`with tracked(key, progress):` makes `progress` the run's (found by `for_run(key)`) and ticks it."""

    def __init__(self, key: str, progress: JobProgress):
        self.key, self.progress = key, progress
        self.ticker = _Ticker(progress, min(progress.every, 5.0)) if not progress.tty else None

    def __enter__(self) -> JobProgress:
        with _RUNS_LOCK:
            _RUNS[self.key] = self.progress
        if self.ticker is not None:
            self.ticker.start()
        return self.progress

    def __exit__(self, *exc: Any) -> None:
        if self.ticker is not None:
            self.ticker.stopped.set()
        with _RUNS_LOCK:
            if _RUNS.get(self.key) is self.progress:
                del _RUNS[self.key]
        self.progress.close()


def for_run(key: str) -> JobProgress | None:
    """The progress of the run writing to `key` (its output folder); None outside a tracked run."""
    with _RUNS_LOCK:
        return _RUNS.get(key)


@contextlib.contextmanager
def job_progress(job: Any, loaded: Any) -> Iterator[JobProgress]:
    """One progress for a whole run (items done of every item, across windows and retry passes), found by the
    run's tasks with `for_run(<output folder>)`."""
    progress = JobProgress(job.name, len(loaded.items) + len(loaded.rejected), job.sampling.candidates)
    with tracked(run_key(job), progress):
        yield progress


def run_key(job: Any) -> str:
    """The key a run's progress is found by: its output folder."""
    return str(Path(job.output.dir).resolve())
