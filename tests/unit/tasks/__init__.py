"""Tests of the tasks package's plain functions, one module per module."""
