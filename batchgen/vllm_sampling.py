"""The installed vLLM's SamplingParams fields a job passes through under their own names (sampling.<field>):
which exist, which batchgen sets itself, and vLLM's own types for their values, read from vLLM's class.

vLLM is imported only when a job names such a field (or when generation builds its parameters).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

# SamplingParams fields batchgen sets itself, and why a job may not.
MANAGED_PARAMS = {
    "output_kind": "batchgen takes each request's outputs once it is finished",
    "stream_interval": "batchgen takes each request's outputs once it is finished",
    "skip_clone": "batchgen shares one SamplingParams between requests, so vLLM must copy it",
    "output_text_buffer_length": "it is vLLM's internal state",
    "detokenize": "outputs are validated and published as text",
    "structured_outputs": "use sampling.json_schema, regex, choice or grammar",
}


@functools.cache
def _array_fields() -> frozenset[str]:
    """SamplingParams fields vLLM types as numpy arrays (read once: a request's parameters are built often)."""
    import msgspec
    from vllm.sampling_params import SamplingParams

    return frozenset(f.name for f in msgspec.structs.fields(SamplingParams) if "ndarray" in str(f.type))


def vllm_values(values: dict[str, Any]) -> dict[str, Any]:
    """A job's values of SamplingParams fields as vLLM types them: a list for a numpy-array field becomes one."""
    arrays = _array_fields()
    if not arrays & set(values):
        return values
    import numpy as np

    return {k: np.asarray(v) if k in arrays and v is not None else v for k, v in values.items()}


def vllm_sampling_fields() -> list[str]:
    """The public fields of the installed vLLM's SamplingParams (read from the class, not listed here)."""
    import msgspec
    from vllm.sampling_params import SamplingParams

    return [f.name for f in msgspec.structs.fields(SamplingParams) if not f.name.startswith("_")]


def passthrough_problem(extra: dict[str, Any], own_fields: Iterable[str]) -> tuple[str | None, str] | None:
    """(field or None, message) when the installed vLLM refuses a job's passed-through sampling fields `extra`:
    one batchgen sets itself, one SamplingParams does not have (`own_fields`: batchgen's sampling fields, named
    in the message), or a value of the wrong type by vLLM's own field types (msgspec); None when all are fine."""
    valid = vllm_sampling_fields()
    for name in extra:
        if name in MANAGED_PARAMS:
            return name, f"set by batchgen, not by the job ({MANAGED_PARAMS[name]})"
        if name not in valid:
            own = sorted(set(own_fields) | (set(valid) - set(MANAGED_PARAMS)))
            return name, (f"unknown field {name!r}: neither a batchgen sampling field nor a field of the installed "
                          f"vLLM's SamplingParams; valid names: {', '.join(own)}")
    import msgspec
    from vllm.sampling_params import SamplingParams

    try:  # vLLM's own field types (msgspec), before any engine exists
        msgspec.convert(vllm_values(extra), SamplingParams, strict=False)
    except msgspec.ValidationError as exc:
        where = re.search(r"`\$\.(\w+)", str(exc))
        message = str(exc).replace("`$.", "`sampling.").replace(" - at `key` in", " in a key of")
        if where:
            return where.group(1), message.replace(f" - at `sampling.{where.group(1)}`", "")
        return None, message
    except (ValueError, TypeError) as exc:
        return None, f"vLLM refuses {', '.join(extra)}: {exc}"
    return None
