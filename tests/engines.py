"""Stand-in engines for orchestration tests: vLLM's LLMEngine surface (add_request / step) over a function that
answers a batch like `LLM.generate`. The proof that generation works is the end-to-end tier on the real engine."""

from __future__ import annotations

import bisect
from types import SimpleNamespace
from typing import Any, Callable

from batchgen.engine import Engine
from batchgen.models import ModelRef


class StandInCore:
    """LLMEngine's add_request / step / has_unfinished_requests / abort_request. Each step answers up to `per_step`
    pending requests (all when None) through `answer(prompts, params)`, which returns one output per prompt."""

    def __init__(self, answer: Callable[[list[Any], list[Any]], list[Any]], per_step: int | None = None,
                 max_num_seqs: int | None = None):
        self.answer = answer
        self.per_step = per_step
        if max_num_seqs is not None:  # as vLLM's engine says it (EngineStream's capacity)
            self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
        self.pending: list[tuple[str, Any, Any]] = []
        self.aborted: list[str] = []
        self.priorities: dict[str, int] = {}  # as vLLM's priority policy: lower first, then first come
        self.step_sizes: list[int] = []  # how many requests each step answered

    def add_request(self, request_id: str, prompt: Any, params: Any, lora_request: Any = None,
                    priority: int = 0) -> str:
        self.priorities[request_id] = priority
        # after every request of the same or a lower priority: first come within a priority
        bisect.insort_right(self.pending, (request_id, prompt, params), key=lambda request: self.priorities[request[0]])
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def get_num_unfinished_requests(self) -> int:
        return len(self.pending)

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        gone = set(request_ids)
        self.aborted.extend(request_ids)
        self.pending = [p for p in self.pending if p[0] not in gone]

    def step(self) -> list[Any]:
        count = len(self.pending) if self.per_step is None else self.per_step
        batch, self.pending = self.pending[:count], self.pending[count:]
        self.step_sizes.append(len(batch))
        outputs = self.answer([prompt for _, prompt, _ in batch], [params for _, _, params in batch])
        for (request_id, _, _), output in zip(batch, outputs):
            output.request_id = request_id
            output.finished = True
        return outputs


def stand_in_engine(llm: Any, per_step: int | None = None, max_num_seqs: int | None = None) -> Engine:
    """An Engine over a stand-in LLM with a `generate(prompts, params, use_tqdm)` method; its stream feeds
    `llm.llm_engine`, a StandInCore answering through that method."""
    llm.llm_engine = StandInCore(lambda prompts, params: llm.generate(prompts, params, use_tqdm=False), per_step,
                                 max_num_seqs)
    return Engine(llm=llm, model=ModelRef(name="stand-in", path="/stand-in"), args={}, max_model_len=2048,
                  load_seconds=0.0)


def completion(index: int, text: str, token_ids: list[int], finish_reason: str) -> SimpleNamespace:
    return SimpleNamespace(index=index, text=text, token_ids=token_ids, cumulative_logprob=None,
                           finish_reason=finish_reason, stop_reason=None, logprobs=None)


class ProcessStandInLLM:
    """vllm.LLM's surface that batchgen.engine_process uses, for an engine process started with the factory
    "tests.engines:ProcessStandInLLM": `per_step` requests answered every `seconds`, each output's text naming its
    prompt's first token id."""

    def __init__(self, per_step: int = 2, seconds: float = 0.02, fail: bool = False, max_num_seqs: int | None = None,
                 fits: int = 0):
        if fail:
            raise ValueError("no such model (stand-in)")
        self.seconds, self.fits = seconds, fits  # outputs of a budget under `fits` are cut off ("length")
        self.llm_engine = StandInCore(self.answer, per_step, max_num_seqs)
        self.llm_engine.model_config = SimpleNamespace(max_model_len=2048, dtype="float32")

    def answer(self, prompts: list[Any], params: list[Any]) -> list[Any]:
        import time

        time.sleep(self.seconds)
        return [SimpleNamespace(outputs=[completion(0, f"out {p['prompt_token_ids'][0]}", [7, 8],
                                                    "length" if getattr(q, "max_tokens", 0) < self.fits else "stop")],
                                prompt_logprobs=None) for p, q in zip(prompts, params)]

    def generate(self, prompts: list[Any], params: Any, use_tqdm: bool = False) -> list[Any]:
        outputs = self.answer(prompts, [params] * len(prompts))
        for number, output in enumerate(outputs):
            output.request_id, output.finished = str(number), True
        return outputs


def process_id(llm: Any) -> int:
    """For Engine.run: the id of the process the engine runs in."""
    import os

    return os.getpid()


def aborted_requests(llm: Any) -> list[str]:
    """For Engine.run: the request ids the stand-in engine core was told to abort."""
    return list(llm.llm_engine.aborted)


def priorities_given(llm: Any) -> list[int]:
    """For Engine.run: the priority of each request the stand-in engine core was given, in the order they came."""
    return list(llm.llm_engine.priorities.values())


def step_sizes(llm: Any) -> list[int]:
    """For Engine.run: how many requests each of the stand-in engine core's steps answered, in order."""
    return list(llm.llm_engine.step_sizes)


def fail(llm: Any, message: str) -> None:
    """For Engine.run: a call that raises."""
    raise ValueError(message)


def thread_names(llm: Any) -> list[str]:
    """For Engine.run: the names of the threads alive in the engine's process."""
    import threading

    return [thread.name for thread in threading.enumerate()]
