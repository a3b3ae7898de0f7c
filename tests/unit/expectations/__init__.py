"""Tests of the expectations package, one module per module."""
