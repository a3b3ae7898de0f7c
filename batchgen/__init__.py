"""batchgen: offline batch generation with vLLM as a Prefect workflow."""

__version__ = "0.1.0"
