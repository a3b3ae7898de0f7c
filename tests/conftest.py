"""Shared test setup: an isolated Prefect home, the model cache, example data helpers."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"

# Before Prefect is imported anywhere: a database left by another Prefect version breaks this one.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="batchgen-test-prefect-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("BATCHGEN_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(ROOT / "examples"))


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    """Each test leaves the environment as it found it: the command line run in-process quiets libraries through
    environment variables (batchgen.cli), which would otherwise reach every later test's subprocesses (a Prefect
    worker logging warnings only), and test modules run in any order under pytest-xdist."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def prefect_server():
    """A temporary Prefect server (SQLite) for every flow run in the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def write_products(path: Path, count: int, lang: str = "en", seed: int = 7) -> list[dict[str, str]]:
    """A product table like the example job's, written as CSV."""
    import make_products

    rows = make_products.products(make_products.ZH if lang == "zh" else make_products.EN, count, seed)
    make_products.write_csv(path, rows)
    return rows


def product_job(tmp: Path, count: int, **sections) -> dict:
    """A product-description job over `count` fresh products, as a mapping."""
    write_products(tmp / "products.csv", count)
    job = {
        "name": "test-products",
        "input": {"path": str(tmp / "products.csv"), "id_column": "product_id"},
        "prompt": {
            "system": "You are a copywriter for an online shop.",
            "template": "Write a short marketing description of {{ name }} ({{ feature }}) for {{ audience }}. "
                        "Mention {{ name }}.",
        },
        "sampling": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 12, "stop": ["\n\n"]},
        "expectations": {"min_chars": 10, "keyword_column": "name"},
        "retry": {"max_passes": 3, "strategy": "grow", "growth_factor": 2, "max_tokens_cap": 96},
        "output": {"dir": str(tmp / "out"), "jsonl": True},
        "chunk_size": 16,
    }
    for key, value in sections.items():
        job[key] = {**job.get(key, {}), **value} if isinstance(value, dict) else value
    return job
