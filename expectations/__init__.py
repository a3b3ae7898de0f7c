"""Great Expectations suites built from a job's expectations."""
