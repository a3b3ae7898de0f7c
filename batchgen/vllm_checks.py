"""The installed vLLM's own validation of sampling values, asked without an engine.

Parameters are built exactly as generation builds them (`sampling_kwargs`, `engine_budget`,
`sampling_params`), so what passes here is what the engine is given.
"""

from __future__ import annotations

import re
from typing import Any

from batchgen.job import SamplingSpec


def first_sentence(text: str) -> str:
    """vLLM's and pydantic's messages without the dump around them: the first line's first sentence."""
    text = re.sub(r"\s*\(parameter=[^()]*\)\s*$", "", text.strip())  # VLLMValidationError's own suffix
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and re.match(r"\d+ validation errors? for ", lines[0]) and len(lines) > 1:
        text = lines[1]  # pydantic: "1 validation error for ModelConfig", then the message
    else:
        text = lines[0] if lines else text
    text = text.removeprefix("Value error, ")
    text = re.sub(r"\s*\[type=.*$", "", text)
    match = re.match(r"(.+?\.)(\s+[A-Z]|$)", text)
    return match.group(1) if match else text


def sampling_problem(sampling: SamplingSpec, model_config: Any = None, tokenizer: Any = None,
                     max_tokens: int | None = None, temperature: float | None = None) -> tuple[str, str] | None:
    """(field, vLLM's message) when the installed vLLM refuses the job's sampling values (with a row's own
    max_tokens / temperature), or None. The parameters are built as generation builds them."""
    from batchgen.generation import engine_budget, sampling_kwargs, sampling_params
    from batchgen.records import GenRequest

    base = sampling_kwargs(sampling)
    request = GenRequest(item_id="", prompt="", prompt_token_ids=[], n=sampling.candidates,
                         max_tokens=sampling.max_tokens if max_tokens is None else max_tokens,
                         temperature=temperature)
    try:
        if base.get("beam_search"):
            from vllm.sampling_params import BeamSearchParams

            kwargs = engine_budget(base, request)
            BeamSearchParams(beam_width=kwargs["beam_width"], max_tokens=kwargs["max_tokens"],
                             temperature=kwargs["temperature"], length_penalty=kwargs["length_penalty"],
                             ignore_eos=kwargs["ignore_eos"])
            return None
        params = sampling_params(engine_budget(base, request))
        if model_config is not None:
            params.verify(model_config, None, None, tokenizer)
    except (ValueError, TypeError) as exc:
        return getattr(exc, "parameter", None) or "", first_sentence(str(exc))
    except Exception as exc:  # vLLM's own VLLMValidationError is not a ValueError
        from vllm.exceptions import VLLMValidationError

        if not isinstance(exc, VLLMValidationError):
            raise
        return exc.parameter or "", first_sentence(str(exc))
    return None




def cpu_problem(spec: Any, cpu: bool | None = None) -> tuple[str, str] | None:
    """(field, why) when the job asks for something the CPU build of vLLM cannot do, or None (GPUs: always None).

    A per-request seed with temperature > 0 kills the CPU engine's sampler ("CPU Generator does not use
    offset"): a seed is allowed there only when no request samples, first pass, per-row temperatures and
    resampled attempts included."""
    if cpu is None:
        from batchgen.engine import on_cpu

        cpu = on_cpu()
    sampling = spec.sampling
    if not cpu:
        return None
    if spec.engine.enable_lora and sampling.passthrough.get("prompt_logprobs") is not None:
        # vLLM 0.32's CPU LoRA logits processor fails on prompt logprobs (einsum shape error in bgmv_shrink)
        return "sampling.prompt_logprobs", ("with engine.enable_lora the CPU build of vLLM fails computing prompt "
                                            "logprobs (its LoRA logits processor); leave one of them out or run on "
                                            "a GPU")
    if sampling.seed is None or sampling.use_beam_search:
        return None
    why = ("a per-request seed with temperature > 0 crashes vLLM's CPU engine; leave sampling.seed out "
           "(engine.seed seeds the engine) or run on a GPU")
    if sampling.temperature > 0:
        return "sampling.seed", f"{why} (sampling.temperature is {sampling.temperature})"
    if "temperature" in sampling.overrides:
        return "sampling.seed", f"{why} (sampling.overrides.temperature takes rows' own temperatures)"
    if set(spec.retry.on) - {"truncated"} and spec.retry.temperature_step > 0:
        return "sampling.seed", f"{why} (retry.temperature_step raises the temperature of resampled attempts)"
    return None
