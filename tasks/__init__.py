"""Prefect tasks: one module per step, each a thin wrapper over plain functions in batchgen/."""
