"""batchgen: offline batch generation with vLLM as a Prefect workflow."""

import os as _os

__version__ = "0.1.0"

# Process defaults, set before Prefect and vLLM read their settings (never overriding the user's):
# vLLM logs to stderr so that stdout carries only results; the temporary Prefect server may
# take longer than Prefect's 20 s to start on a busy machine; no telemetry from a batch job.
for _name, _value in (
    ("VLLM_LOGGING_STREAM", "ext://sys.stderr"),
    ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"),
    ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
    ("GX_ANALYTICS_ENABLED", "false"),
):
    _os.environ.setdefault(_name, _value)
