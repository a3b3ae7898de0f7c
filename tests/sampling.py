"""Sampling settings the unit tests share: a JSON schema, a value for each passthrough field of vLLM's
SamplingParams, and the SamplingParams a spec gives."""

from __future__ import annotations

from batchgen.generation import (
    GenRequest,
    engine_budget,
    sampling_kwargs,
    sampling_params,
)
from batchgen.job import SamplingSpec

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "price": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "price"]}


# A value other than vLLM's default for each SamplingParams field the job does not declare itself. The test
# below fails when the installed vLLM gains a field, so the table (and docs/generation.md) keep up with it.
PASSTHROUGH_VALUES = {
    "watermarking": True,
    "prompt_logprobs": 2,
    "prompt_logprob_token_ids": [[1, 2]],
    "prompt_logprob_start": 1,
    "logprob_token_ids": [5, 6],
    "flat_logprobs": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "logit_bias": {42: 5.0},
    "allowed_token_ids": [1, 2, 3],
    "extra_args": {"custom": 1},
    "bad_words": ["cheap"],
    "skip_reading_prefix_cache": True,
    "thinking_token_budget": 8,
    "routed_experts_prompt_start": 2,
    "trace_decode_token_ids": [7],
}


def params_of(spec: SamplingSpec, request: GenRequest | None = None):
    request = request or GenRequest(item_id="a", prompt="", prompt_token_ids=[1], max_tokens=spec.max_tokens,
                                    n=spec.candidates)
    return sampling_params(engine_budget(sampling_kwargs(spec), request))
