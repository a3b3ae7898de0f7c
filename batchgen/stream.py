"""The engine as a stream: requests go in as soon as they are known, outputs come out as they finish.

`LLM.generate` adds a batch and runs the engine until that batch is done, so consecutive
calls drain the running batch between them and the engine waits while the caller works.
Here one thread per engine owns vLLM's `LLMEngine` and steps it while it has work; any
task may submit requests at any time (one window's first pass while another window's
retry pass is still running) and reads its outputs as they finish. The engine idles only
when no submitter has anything left.

Only the stream's thread touches the engine. vLLM's API used: `LLMEngine.add_request`,
`step`, `has_unfinished_requests`, `abort_request` (the same in vLLM 0.26 to 0.33).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("batchgen.stream")

# Requests added between two engine steps: the engine keeps stepping while a large submission
# is still being added (each add tokenizes nothing but does validate and copy its parameters).
# BATCHGEN_STREAM_ADD_PER_STEP=N sets it for the process and the engine processes it starts (benchmarks.run
# --add-per-step: for comparing runs of this setting).
ADD_PER_STEP = 256
ADD_PER_STEP_ENV = "BATCHGEN_STREAM_ADD_PER_STEP"

# Spare requests (submit(spare=True)) enter the engine only while it holds fewer requests than this share of its
# max_num_seqs: a step's time barely grows with a batch that small, so what a spare request costs, when it is
# withdrawn, is little engine time that nothing else wanted.
SPARE_SHARE = 0.25


def default_add_per_step() -> int:
    """Requests added between two steps: BATCHGEN_STREAM_ADD_PER_STEP where it is a positive whole number, else
    ADD_PER_STEP."""
    value = os.environ.get(ADD_PER_STEP_ENV, "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value:
        log.warning("%s=%r is not a positive whole number: %d requests are added per step", ADD_PER_STEP_ENV,
                    value, ADD_PER_STEP)
    return ADD_PER_STEP


class StreamError(RuntimeError):
    """The engine failed while this submission's requests were in it (the stream is dead)."""


@dataclass
class _Message:
    kind: str  # add | cancel | withdraw | promote | call | stop
    submission: Submission | None = None
    call: Callable[[], Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class Submission:
    """The outputs of one batch of requests, handed over in the order they finish."""

    def __init__(self, stream: EngineStream, prompts: list[Any], params: list[Any], tag: str):
        self.stream = stream
        self.prompts, self.params = prompts, params
        self.loras: list[Any] | None = None  # a LoRARequest (or None) per prompt, when any request uses an adapter
        self.priorities: list[int] | None = None  # vLLM's priority per prompt (lower first), when any is not 0
        self.spare = False  # its requests enter the engine only when it has room (EngineStream.submit)
        self.ids = [f"{tag}-{i}" for i in range(len(prompts))]
        self.total = len(prompts)
        self.received = 0
        self._outputs: queue.SimpleQueue = queue.SimpleQueue()
        self.first_added_at: float | None = None  # perf_counter when its first request entered the engine
        self.last_output_at: float | None = None
        self.offset = 0  # where its indices start in its parent's (see join)
        self.parent: Submission | None = None
        self.children: list[Submission] = []

    def join(self, parent: Submission) -> None:
        """Make this (new, not yet sent) submission part of `parent`: its outputs come through the parent's
        iterators, indexed after the parent's requests so far, and the parent waits for them too. Called by the
        parent's reader (e.g. follow-up requests of outputs it has just read), before the requests are sent."""
        self._outputs, self.offset, self.parent = parent._outputs, parent.total, parent
        parent.total += self.total
        parent.children.append(self)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        """(index into the submitted lists, vLLM RequestOutput) as each request finishes; the output is None for
        a request withdrawn before it finished (withdraw)."""
        while self.received < self.total:
            got = self._outputs.get()
            if isinstance(got, BaseException):
                raise StreamError(f"the engine failed: {type(got).__name__}: {got}") from got
            self.received += 1
            yield got

    def batches(self, max_items: int, max_seconds: float, urgent: Callable[[int, Any], bool] | None = None,
                urgent_seconds: float = 0.0) -> Iterator[list[tuple[int, Any]]]:
        """Finished outputs in batches of at most `max_items`; an output waits at most `max_seconds` for others to
        join its batch, or `urgent_seconds` once the batch holds one for which `urgent(index, output)` is true (an
        output whose follow-up request waits for its batch). While nothing is waiting to be handed over, the reader
        sleeps until the next output: an idle reader does not wake up (in the engine's process every submission has
        one, and readers woken every few milliseconds take the interpreter from the engine's loop)."""
        batch: list[tuple[int, Any]] = []
        deadline = 0.0
        while self.received < self.total:
            if not batch:
                got = self._outputs.get()
                deadline = time.monotonic() + max_seconds
            else:
                timeout = deadline - time.monotonic()
                try:
                    got = self._outputs.get(timeout=timeout) if timeout > 0 else self._outputs.get_nowait()
                except queue.Empty:
                    got = None
            if isinstance(got, BaseException):
                raise StreamError(f"the engine failed: {type(got).__name__}: {got}") from got
            if got is not None:
                self.received += 1
                batch.append(got)
                if urgent is not None and got[1] is not None and urgent(*got):
                    deadline = min(deadline, time.monotonic() + urgent_seconds)
            if batch and (len(batch) >= max_items or time.monotonic() >= deadline or self.received == self.total):
                yield batch
                batch = []
        if batch:
            yield batch

    def cancel(self) -> None:
        """Take this submission's unfinished requests (and its joined ones') out of the engine (a failed or
        abandoned task)."""
        if self.received < self.total and self.stream.alive:
            try:
                for submission in (self, *self.children):
                    self.stream._send(_Message("cancel", submission=submission))
            except StreamError:  # the engine died meanwhile: nothing of this submission is left in it
                pass

    def withdraw(self) -> None:
        """Take this (joined) submission's unfinished requests out of the engine, its reader still reading: each
        one's output comes through as None instead, so exactly one output or None arrives per request (an output
        that had finished before the withdrawal comes as it is)."""
        self.stream._send(_Message("withdraw", submission=self))

    def promote(self) -> None:
        """A spare submission's requests enter the engine like any others, room or not (no-op once they are in)."""
        self.stream._send(_Message("promote", submission=self))


def _capacity(engine: Any) -> int | None:
    """How many requests vLLM's engine runs at once (its scheduler's max_num_seqs), when it says."""
    scheduler = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
    value = getattr(scheduler, "max_num_seqs", None)
    return value if isinstance(value, int) else None


def count_step(by_held: dict[int, list[float]], held: int, seconds: float) -> None:
    """Count an engine step of `seconds` taken with `held` requests in the engine, by powers of two: key k holds
    the steps with k to 2k - 1 requests, [steps, seconds] (how the engine's pace goes with its occupancy)."""
    key = 1 << (max(held, 1).bit_length() - 1)
    counted = by_held.setdefault(key, [0, 0.0])
    counted[0] += 1
    counted[1] += seconds


def feed_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What EngineStream.feed() counted between two readings, with the time-weighted requests in the engine and
    the share of the stepping time it was full."""
    delta = {key: after[key] - before[key] for key in ("steps", "busy_seconds", "full_seconds", "request_seconds")}
    earlier, delta["by_held"] = before.get("by_held", {}), {}
    for key, (steps, seconds) in after.get("by_held", {}).items():
        steps_before, seconds_before = earlier.get(key, (0, 0.0))
        if steps > steps_before:
            delta["by_held"][key] = [steps - steps_before, seconds - seconds_before]
    busy = delta["busy_seconds"]
    delta["capacity"] = after["capacity"]
    delta["mean_requests"] = delta["request_seconds"] / busy if busy > 0 else None
    delta["full_share"] = delta["full_seconds"] / busy if busy > 0 and after["capacity"] else None
    return delta


class EngineStream:
    """One thread that feeds and steps one vLLM engine for every submitter in the process."""

    def __init__(self, engine: Any, add_per_step: int | None = None):
        self.engine = engine  # vllm's LLMEngine (LLM.llm_engine)
        self.add_per_step = add_per_step or default_add_per_step()
        self._inbox: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._routes: dict[str, tuple[Submission, int]] = {}
        self._adding: list[tuple[Submission, int]] = []  # (submission, next index to add)
        self._spare: list[Submission] = []  # spare submissions waiting for room in the engine
        self._deferred: list[_Message] = []  # calls waiting for an idle engine
        self._tags = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.busy_seconds = 0.0  # time the engine had unfinished requests
        self.steps = 0
        # How well the engine was fed (feed()): the busy time it held at least as many requests as it runs at once
        # (vLLM's max_num_seqs), and its requests weighted by time
        self.capacity = _capacity(engine)
        self.full_seconds = 0.0
        self.request_seconds = 0.0
        self.by_held: dict[int, list[float]] = {}  # steps and their seconds by requests in the engine (count_step)

    def feed(self) -> dict[str, Any]:
        """The engine's feeding so far (counters: subtract two readings for a stretch of time): steps, seconds
        stepping, seconds stepping with at least `capacity` requests in the engine (running and waiting), and
        request-seconds (their time-weighted count is request_seconds / busy_seconds); `by_held`: the steps and
        their seconds by how many requests the engine held (count_step)."""
        return {"steps": self.steps, "busy_seconds": self.busy_seconds, "full_seconds": self.full_seconds,
                "request_seconds": self.request_seconds, "capacity": self.capacity,
                "by_held": {key: list(counted) for key, counted in self.by_held.items()}}

    # ---------------------------------------------------------------- submitters' side

    def submit(self, prompts: list[Any], params: list[Any], loras: list[Any] | None = None,
               into: Submission | None = None, priorities: list[int] | None = None, spare: bool = False) -> Submission:
        """Queue requests (vLLM prompts, e.g. TokensPrompt, and one SamplingParams each, and optionally one
        LoRARequest or None each, and one vLLM priority each: lower runs first, on an engine built with
        scheduling_policy "priority"); returns at once. `into`: add them to that submission (Submission.join),
        from the thread that reads it. `spare`: the requests may turn out not to be needed (Submission.withdraw):
        they enter the engine only while it holds fewer than SPARE_SHARE of its max_num_seqs (an engine that does
        not say how many it runs: never), or once promoted (Submission.promote)."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling parameters")
        submission = Submission(self, prompts, params, f"bg{next(self._tags)}")
        submission.loras = loras if loras and any(lora is not None for lora in loras) else None
        submission.priorities = priorities if priorities and any(priorities) else None
        submission.spare = spare
        if into is not None:
            submission.join(into)
        if prompts:
            self._send(_Message("add", submission=submission))
        return submission

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn()` on the stream's thread once the engine has no unfinished requests (beam search,
        a prefix-cache reset): the engine is never used from two threads."""
        message = _Message("call", call=fn)
        self._send(message)
        message.done.wait()
        if message.error is not None:
            raise message.error
        return message.result

    def close(self) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
            self._inbox.put(_Message("stop"))
            thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._error is None

    def _send(self, message: _Message) -> None:
        with self._lock:
            if self._error is not None:
                raise StreamError(f"the engine failed earlier: {type(self._error).__name__}: {self._error}")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="batchgen-engine-stream", daemon=True)
                self._thread.start()
            self._inbox.put(message)

    # ---------------------------------------------------------------- the stream's thread

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the engine died: every waiting submitter hears of it
            log.error("engine stream stopped: %s: %s", type(exc).__name__, exc)
            with self._lock:
                self._error = exc
            self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for submission in {s for s, _ in self._routes.values()} | {s for s, _ in self._adding} | set(self._spare):
            submission._outputs.put(exc)
        self._routes.clear()
        self._adding.clear()
        self._spare.clear()
        for message in self._deferred:
            message.error = exc
            message.done.set()
        self._deferred.clear()
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                break
            if message.submission is not None and message.kind == "add":
                message.submission._outputs.put(exc)
            message.error = exc
            message.done.set()

    def _loop(self) -> None:
        engine = self.engine
        while True:
            # spares waiting for room keep the loop going only where room can come (a known max_num_seqs)
            busy = bool(self._adding) or (bool(self._spare) and self.capacity is not None) \
                or engine.has_unfinished_requests()
            if not busy and self._deferred:
                for message in self._deferred:
                    self._run_call(message)
                self._deferred.clear()
                continue
            try:
                message = self._inbox.get_nowait() if busy else self._inbox.get()
            except queue.Empty:
                message = None
            while message is not None:
                if not self._handle(message):
                    return
                try:
                    message = self._inbox.get_nowait()
                except queue.Empty:
                    message = None
            self._add_some()
            if engine.has_unfinished_requests():
                held = engine.get_num_unfinished_requests()
                started = time.perf_counter()
                outputs = engine.step()
                seconds = time.perf_counter() - started
                self.busy_seconds += seconds
                self.request_seconds += held * seconds
                if self.capacity is not None and held >= self.capacity:
                    self.full_seconds += seconds
                self.steps += 1
                count_step(self.by_held, held, seconds)
                self._route(outputs)

    def _handle(self, message: _Message) -> bool:
        if message.kind == "stop":  # whoever still waits hears that the engine is gone, rather than waiting on
            closed = StreamError("the engine was shut down")
            with self._lock:
                self._error = closed
            self._fail_all(closed)
            return False
        if message.kind == "add":
            (self._spare.append(message.submission) if message.submission.spare
             else self._adding.append((message.submission, 0)))
        elif message.kind == "cancel":
            self._cancel(message.submission)
        elif message.kind == "withdraw":
            self._withdraw(message.submission)
        elif message.kind == "promote":
            if message.submission in self._spare:
                self._spare.remove(message.submission)
                self._adding.append((message.submission, 0))
        elif message.kind == "call":
            self._deferred.append(message)
        return True

    def _add_some(self) -> None:
        budget = self.add_per_step
        if self._spare and not self._adding and self.capacity is not None:  # spares while there is room
            held = self.engine.get_num_unfinished_requests()
            room = max(int(self.capacity * SPARE_SHARE), 1) - held
            while self._spare and room > 0:
                spare = self._spare.pop(0)
                self._adding.append((spare, 0))
                room -= len(spare.ids)
        while self._adding and budget > 0:
            submission, start = self._adding[0]
            # its own requests: `total` counts those joined to it too, which are added as submissions of their own
            stop = min(start + budget, len(submission.ids))
            if submission.first_added_at is None:
                submission.first_added_at = time.perf_counter()
            loras, priorities = submission.loras, submission.priorities
            for index in range(start, stop):
                request_id = submission.ids[index]
                self._routes[request_id] = (submission, index)
                if loras is None and priorities is None:
                    self.engine.add_request(request_id, submission.prompts[index], submission.params[index])
                else:
                    extra: dict[str, Any] = {}
                    if loras is not None:
                        extra["lora_request"] = loras[index]
                    if priorities is not None:
                        extra["priority"] = priorities[index]
                    self.engine.add_request(request_id, submission.prompts[index], submission.params[index], **extra)
            budget -= stop - start
            if stop == len(submission.ids):
                self._adding.pop(0)
                submission.prompts = submission.params = []  # the engine holds its own copies now
                submission.loras = submission.priorities = None
            else:
                self._adding[0] = (submission, stop)

    def _route(self, outputs: list[Any]) -> None:
        now = time.perf_counter()
        for output in outputs:
            if not output.finished:
                continue
            route = self._routes.pop(output.request_id, None)
            if route is None:  # a cancelled submission's straggler
                continue
            submission, index = route
            submission.last_output_at = now
            if submission.parent is not None:
                submission.parent.last_output_at = now
            submission._outputs.put((submission.offset + index, output))

    def _cancel(self, submission: Submission) -> list[int]:
        """Take the submission's requests out of the engine and the queues; returns the indices of those that
        had not finished."""
        left = [index for s, start in self._adding if s is submission for index in range(start, len(s.ids))]
        if submission in self._spare:
            self._spare.remove(submission)
            left = list(range(len(submission.ids)))
        self._adding = [(s, i) for s, i in self._adding if s is not submission]
        ids = [request_id for request_id, (s, _) in self._routes.items() if s is submission]
        for request_id in ids:
            left.append(self._routes.pop(request_id)[1])
        if ids:
            self.engine.abort_request(ids)
        return left

    def _withdraw(self, submission: Submission) -> None:
        for index in self._cancel(submission):  # the reader hears of each one: None in place of its output
            submission._outputs.put((submission.offset + index, None))

    def _run_call(self, message: _Message) -> None:
        try:
            message.result = message.call()
        except BaseException as exc:  # handed to the caller, the stream goes on
            message.error = exc
        message.done.set()
