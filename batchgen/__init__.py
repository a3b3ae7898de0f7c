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


def _vllm_logging() -> None:
    """vLLM applies a logging.config.dictConfig when an engine starts. Inside a Prefect run that flushes Prefect's
    API log handler while holding the logging module's lock, and a run whose engine started beside another
    thread's logging deadlocked there. So vLLM's logging is not configured by vLLM (VLLM_CONFIGURE_LOGGING=0,
    unless the user set it): batchgen gives the `vllm` logger one stderr handler itself."""
    import logging
    import sys

    class Stderr(logging.StreamHandler):
        @property
        def stream(self):  # the current stderr (tests and terminals replace it)
            return sys.stderr

        @stream.setter
        def stream(self, value):
            pass

    handler = Stderr()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S"))
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    logger.setLevel(_os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    logger.propagate = False


if "VLLM_CONFIGURE_LOGGING" not in _os.environ:
    _os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    _vllm_logging()
