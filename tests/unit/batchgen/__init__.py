"""Tests of the batchgen package, one module per module."""
