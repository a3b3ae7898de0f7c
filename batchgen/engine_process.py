"""vLLM's front end in a process of its own, so that on a GPU the engine never waits for the pipeline's Python.

vLLM's `LLMEngine` runs in the process that builds `vllm.LLM`: it adds requests, and at every step detokenizes
each running sequence (stop strings need the text) and builds the finished outputs. With a small model on a fast
GPU that front end sets the pace (an H200 was busy 10-18% of the time with the default model), and in the run's
process it shares one interpreter lock with the pipeline's own work: the next window's prompts, the validation
and staging of finished windows, Prefect's bookkeeping. Each slows the other. Here the engine and its stream
(batchgen.stream) live in a child process with an interpreter of its own; the run's process sends requests
(prompt token ids, SamplingParams) and receives finished outputs (text, token ids, finish and stop reasons,
logprobs when asked) over a socket, and the two work on separate cores.

The child is `python -m batchgen.engine_process FD`. It reads the `vllm.LLM` arguments, builds the engine,
answers `ready` with what vLLM loaded, then serves until told to stop or until its socket closes (the run's
process is gone), stopping vLLM before it exits:

    add SUB PROMPTS PARAMS LORAS PRIORITIES SPARE
                                   -> out SUB [(index, Output), ...] FIRST_ADDED LAST_OUTPUT, as requests finish
                                      (or failed SUB TEXT when the engine dies)
    cancel SUB
    withdraw SUB                   -> out SUB [(index, None), ...] ... for its requests that had not finished
    promote SUB
    call ID (MODULE, NAME, ARGS)   -> result ID OK VALUE: MODULE.NAME(llm, *ARGS) on the stream's thread once it
                                      is idle (pickled on its own, so that what does not unpickle fails the call)
    stop

Times are `time.perf_counter()` values, which are the same clock in both processes (CLOCK_MONOTONIC on Linux).
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from batchgen.models import ModelRef
from batchgen.stream import StreamError, Submission

log = logging.getLogger("batchgen.engine")

# Outputs are sent back in batches of at most this many, or what has finished after this long.
SEND_ITEMS, SEND_SECONDS = 256, 0.02
STOP_SECONDS = 30  # for the child to stop vLLM and exit before it is killed


# ---------------------------------------------------------------- what crosses the socket


class Logprob(NamedTuple):  # the attributes of vllm.logprobs.Logprob that batchgen reads
    logprob: float
    rank: int | None
    decoded_token: str | None


class Completion(NamedTuple):  # vllm.CompletionOutput, the fields batchgen reads
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: list[dict[int, Logprob]] | None


class Output(NamedTuple):  # vllm.RequestOutput, the fields batchgen reads
    request_id: str
    outputs: list[Completion]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    finished: bool = True


def _plain_logprobs(positions: Any) -> list[dict[int, Logprob] | None] | None:
    if positions is None:
        return None
    return [None if position is None else
            {int(token): Logprob(float(lp.logprob), lp.rank, lp.decoded_token) for token, lp in position.items()}
            for position in positions]


def plain_output(output: Any) -> Output:
    """A vLLM RequestOutput as plain tuples: small to pickle, the same attributes for batchgen's readers."""
    return Output(str(output.request_id),
                  [Completion(c.index, c.text, list(c.token_ids), c.cumulative_logprob, c.finish_reason,
                              c.stop_reason, _plain_logprobs(c.logprobs)) for c in output.outputs],
                  _plain_logprobs(getattr(output, "prompt_logprobs", None)))


_STREAMS: dict[int, Any] = {}  # id(llm) -> the EngineStream that feeds it, in the engine process


def stream_feed(llm: Any) -> dict[str, Any]:
    """For Engine.run: the feeding counters of the stream that feeds `llm` (EngineStream.feed)."""
    return _STREAMS[id(llm)].feed()


def swap_add_per_step(stream: Any, add_per_step: int) -> int:
    """Set how many requests `stream` (an EngineStream) adds between two engine steps; returns the setting it
    replaces (benchmarks.run --flow-variants compares settings on one engine)."""
    previous, stream.add_per_step = stream.add_per_step, add_per_step
    return previous


def stream_add_per_step(llm: Any, add_per_step: int) -> int:
    """For Engine.run: swap_add_per_step on the stream that feeds `llm`."""
    return swap_add_per_step(_STREAMS[id(llm)], add_per_step)


def generate(llm: Any, prompts: list[Any], params: Any) -> list[Output]:
    """`LLM.generate` as plain outputs (for `Engine.run`: `batchgen check --sample`)."""
    return [plain_output(o) for o in llm.generate(prompts, params, use_tqdm=False)]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- the run's side


class _RemoteSubmission(Submission):
    """A submission whose requests run in the engine process; its outputs arrive through the socket's reader."""

    def __init__(self, stream: RemoteStream, total: int, number: int):
        super().__init__(stream, [], [], f"p{number}")  # type: ignore[arg-type]
        self.total, self.number = total, number
        self.delivered = 0  # outputs the socket's reader has handed over

    def cancel(self) -> None:
        if self.received < self.total and self.stream.alive:
            submissions = (self, *self.children)
            with self.stream._lock:
                for submission in submissions:  # their stragglers are dropped
                    self.stream._submissions.pop(submission.number, None)
            try:
                for submission in submissions:
                    self.stream._send(("cancel", submission.number))
            except StreamError:
                pass

    def withdraw(self) -> None:
        self.stream._send(("withdraw", self.number))

    def promote(self) -> None:
        self.stream._send(("promote", self.number))


class RemoteStream:
    """batchgen.stream.EngineStream's surface for submitters, over the socket to the engine process."""

    def __init__(self, conn: Connection, process: subprocess.Popen):
        self._conn, self._process = conn, process
        self._send_lock, self._lock = threading.Lock(), threading.Lock()
        self._submissions: dict[int, _RemoteSubmission] = {}
        self._calls: dict[int, Future] = {}  # the calls waiting for their result
        self._numbers = itertools.count()
        self._error: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name="batchgen-engine-socket", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._error is None

    def submit(self, prompts: list[Any], params: list[Any], loras: list[Any] | None = None,
               into: Submission | None = None, priorities: list[int] | None = None, spare: bool = False) -> Submission:
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling parameters")
        number = next(self._numbers)
        submission = _RemoteSubmission(self, len(prompts), number)
        if into is not None:
            submission.join(into)
        if prompts:
            with self._lock:
                self._submissions[number] = submission
            loras = loras if loras and any(lora is not None for lora in loras) else None
            self._send(("add", number, prompts, params, loras, priorities if priorities and any(priorities) else None,
                        spare))
        return submission

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(llm, *args) in the engine process, once its engine is idle; fn must be importable (module level)."""
        # fn travels by name; a function of the program run with `python -m NAME` is NAME's there
        module = fn.__module__
        if module == "__main__":
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            if spec is None:
                raise TypeError(f"{fn.__qualname__} is defined in a script run by its path: the engine process "
                                "cannot import it; define it in an importable module")
            module = spec.name
        if "<locals>" in fn.__qualname__ or "<lambda>" in fn.__qualname__:
            raise TypeError(f"{fn.__qualname__} is not importable: the engine process runs only functions defined "
                            "at a module's top level")
        payload = pickle.dumps((module, fn.__qualname__, args))  # unpickled by the call: its errors are its own
        number, answer = next(self._numbers), Future()
        with self._lock:
            self._calls[number] = answer
        self._send(("call", number, payload))
        return answer.result()

    def call(self, fn: Callable[[], Any]) -> Any:
        raise TypeError("the engine runs in a process of its own: use Engine.run(fn, *args) with an importable fn")

    def close(self) -> None:
        """Tell the engine process to stop (also after a failure: it may still be running)."""
        with self._send_lock:
            try:
                self._conn.send(("stop",))
            except (OSError, ValueError):
                pass

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            if self._error is not None:
                raise StreamError(f"the engine failed earlier: {_describe(self._error)}")
            try:
                self._conn.send(message)
            except (OSError, ValueError) as exc:
                raise StreamError(f"the engine process is gone: {_describe(exc)}") from exc

    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "out":
                    _, number, batch, first_added_at, last_output_at = message
                    with self._lock:
                        submission = self._submissions.get(number)
                    if submission is None:  # a cancelled submission's stragglers
                        continue
                    submission.first_added_at = first_added_at
                    submission.last_output_at = last_output_at
                    if submission.parent is not None:
                        submission.parent.last_output_at = last_output_at
                    offset, outputs = submission.offset, submission._outputs
                    for index, output in batch:
                        outputs.put((offset + index, output))
                    submission.delivered += len(batch)
                    if submission.delivered >= submission.total:
                        with self._lock:
                            self._submissions.pop(number, None)
                elif kind == "failed":
                    with self._lock:
                        submission = self._submissions.pop(message[1], None)
                    if submission is not None:
                        submission._outputs.put(StreamError(message[2]))
                elif kind == "result":
                    _, number, ok, value = message
                    with self._lock:
                        answer = self._calls.pop(number, None)
                    if answer is not None and ok:
                        answer.set_result(value)
                    elif answer is not None:
                        answer.set_exception(value if isinstance(value, BaseException) else StreamError(str(value)))
        except (EOFError, OSError) as exc:
            code = self._process.poll()
            error = StreamError("the engine process exited" + (f" (exit code {code})" if code is not None else "")
                                + ("" if isinstance(exc, EOFError) else f": {_describe(exc)}"))
        except BaseException as exc:  # noqa: BLE001  (a message that did not unpickle: the stream is unusable)
            error = StreamError(f"the engine process sent what could not be read: {_describe(exc)}")
        with self._lock:
            self._error = error
            submissions, calls = list(self._submissions.values()), list(self._calls.values())
            self._submissions.clear()
            self._calls.clear()
        for submission in submissions:
            submission._outputs.put(error)
        for answer in calls:
            answer.set_exception(error)


class ProcessEngine:
    """The job's engine in a process of its own: batchgen.engine.Engine's surface, without `llm`."""

    def __init__(self, model: ModelRef, args: dict[str, Any], llm_kwargs: dict[str, Any], factory: str = "vllm:LLM"):
        """Start the engine process and wait until `factory(**llm_kwargs)` (MODULE:NAME, vllm.LLM by default) has
        built the engine there."""
        self.model, self.args = model, args
        started = time.perf_counter()
        parent, child = socket.socketpair()
        env = dict(os.environ)
        # the child imports this package from where this process did (a checkout, PYTHONPATH, an install)
        package_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            # stdout to our stderr: vLLM's messages never mix with results printed on stdout
            self.process = subprocess.Popen([sys.executable, "-m", "batchgen.engine_process", str(child.fileno())],
                                            pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                            stdout=sys.__stderr__.fileno() if sys.__stderr__ else None)
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        try:
            self._conn.send(("start", factory, llm_kwargs))
            message = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._kill()
            raise RuntimeError(f"the engine process exited while starting (exit code {self.process.poll()}); "
                               "its messages are above") from exc
        if message[0] != "ready":
            self._kill()
            raise RuntimeError(f"the engine could not start: {message[1]}")
        facts = message[1]
        self.max_model_len: int = facts["max_model_len"]
        self.dtype: str | None = facts["dtype"]
        self.load_seconds = time.perf_counter() - started
        self.stream = RemoteStream(self._conn, self.process)

    @property
    def llm(self) -> Any:
        raise AttributeError("this engine runs in a process of its own (engine.front_end_process): "
                             "use Engine.run(fn, *args) to run fn(llm, *args) there")

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(llm, *args) in the engine's process once the engine is idle (fn importable at module level)."""
        return self.stream.run(fn, *args)

    def feed(self) -> dict[str, Any]:
        """The engine process's stream's feeding counters (EngineStream.feed)."""
        return self.stream.run(stream_feed)

    def close(self) -> None:
        """Stop the engine process: vLLM shuts down there; killed if it has not exited in STOP_SECONDS."""
        self.stream.close()
        try:
            self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("the engine process did not stop in %d s: killed", STOP_SECONDS)
            self._kill()
        self._conn.close()

    def _kill(self) -> None:
        self.process.kill()
        self.process.wait()


# ---------------------------------------------------------------- the engine process


class _Server:
    def __init__(self, conn: Connection, llm: Any):
        from batchgen.stream import EngineStream

        self.conn, self.llm = conn, llm
        self.stream = EngineStream(llm.llm_engine)
        _STREAMS[id(llm)] = self.stream
        self.submissions: dict[int, Submission] = {}
        self.send_lock = threading.Lock()

    def send(self, message: tuple) -> None:
        with self.send_lock:
            self.conn.send(message)

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the run's process is gone
                return
            kind = message[0]
            if kind == "add":
                _, number, prompts, params, loras, priorities, spare = message
                try:
                    submission = self.stream.submit(prompts, params, loras, priorities=priorities, spare=spare)
                except StreamError as exc:  # the engine died earlier
                    self.send(("failed", number, str(exc)))
                    continue
                self.submissions[number] = submission
                threading.Thread(target=self.forward, args=(number, submission), daemon=True,
                                 name=f"batchgen-forward-{number}").start()
            elif kind == "cancel":
                submission = self.submissions.get(message[1])
                if submission is not None:
                    submission.cancel()
                    submission._outputs.put(StreamError("cancelled"))  # its forwarder stops waiting
            elif kind in ("withdraw", "promote"):
                submission = self.submissions.get(message[1])
                if submission is not None:  # else it has sent every output already
                    try:
                        getattr(submission, kind)()
                    except StreamError:  # the engine died: its forwarder says so
                        pass
            elif kind == "call":
                threading.Thread(target=self.call, args=message[1:], daemon=True, name="batchgen-call").start()
            elif kind == "stop":
                return

    def forward(self, number: int, submission: Submission) -> None:
        try:
            for batch in submission.batches(SEND_ITEMS, SEND_SECONDS):
                self.send(("out", number, [(index, None if output is None else plain_output(output))
                                           for index, output in batch],
                           submission.first_added_at, submission.last_output_at))
        except StreamError as exc:
            self.send(("failed", number, str(exc)))
        except (OSError, ValueError):  # the socket is closed: the run's process is gone
            pass
        finally:
            self.submissions.pop(number, None)

    def call(self, number: int, payload: bytes) -> None:
        try:
            module, name, args = pickle.loads(payload)
            fn: Any = importlib.import_module(module)
            for part in name.split("."):
                fn = getattr(fn, part)
            result = (True, self.stream.call(lambda: fn(self.llm, *args)))
        except BaseException as exc:  # noqa: BLE001  (handed to the caller)
            result = (False, exc)
        try:
            self.send(("result", number, *result))
        except (OSError, ValueError):
            pass
        except Exception:  # noqa: BLE001  (the exception or result did not pickle: say what it was)
            self.send(("result", number, False, StreamError(_describe(result[1]) if not result[0] else
                                                            "the call's result could not be sent back")))


# BATCHGEN_ENGINE_SWITCH_INTERVAL=SECONDS: Python's thread switch interval (sys.setswitchinterval; 0.005 by default)
# in this process (or in the run's, where vLLM's front end runs there), set before vLLM is built, so that vLLM's
# engine core, which vLLM forks from it, has it too. In both, a thread that takes in requests or sends outputs
# shares one interpreter lock with the thread that steps the engine; the interval bounds how long one waits for the
# other to let go of it (benchmarks.run --engine-switch-interval: for comparing runs of this setting).
SWITCH_INTERVAL_ENV = "BATCHGEN_ENGINE_SWITCH_INTERVAL"


def switch_interval_from_env() -> float | None:
    """BATCHGEN_ENGINE_SWITCH_INTERVAL as seconds where it is a positive number (set in this process), else None
    (a value that is not is logged and left out)."""
    value = os.environ.get(SWITCH_INTERVAL_ENV, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 1:
        log.warning("%s=%r is not a number of seconds between 0 and 1: left at %s", SWITCH_INTERVAL_ENV, value,
                    sys.getswitchinterval())
        return None
    sys.setswitchinterval(seconds)
    return seconds


def switch_interval(llm: Any) -> float:
    """The engine process's thread switch interval (for `ProcessEngine.run`)."""
    return sys.getswitchinterval()


def main(fd: int) -> int:
    # Ctrl-C in a terminal reaches every process of the foreground group: the run's process handles it and stops
    # this one (or its socket closes), so the engine is not torn down under a task that is still reading from it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    switch_interval_from_env()
    conn = Connection(fd)
    try:
        _, factory, kwargs = conn.recv()
    except (EOFError, OSError):
        return 1
    try:
        module, _, name = factory.partition(":")
        llm = getattr(importlib.import_module(module), name)(**kwargs)
        config = llm.llm_engine.model_config
        facts = {"max_model_len": int(config.max_model_len), "dtype": str(config.dtype).removeprefix("torch.")}
    except BaseException as exc:  # noqa: BLE001  (said to the run's process, which raises it)
        conn.send(("failed", _describe(exc)))
        return 1
    server = _Server(conn, llm)
    try:
        conn.send(("ready", facts))
        server.serve()
    except (OSError, ValueError):  # the run's process went away while the engine started
        pass
    finally:
        server.stream.close()
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001  (exiting anyway)
            log.debug("engine shutdown failed", exc_info=True)
    return 0


if __name__ == "__main__":
    # through the module's importable name: what crosses the socket must unpickle as batchgen.engine_process.*
    from batchgen.engine_process import main as serve

    sys.exit(serve(int(sys.argv[1])))
