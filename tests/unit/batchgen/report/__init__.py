"""Tests of batchgen.report, one module per module of the package."""
