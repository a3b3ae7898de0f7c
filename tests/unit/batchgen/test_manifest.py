"""The manifest: a window's tally (counts, truncation, rescued items, tokens) from hand-made tables, and what
build_manifest records of the prompt, the input, the model, the software and the code."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from batchgen import provenance
from batchgen.job import job_from_dict
from batchgen.manifest import build_manifest, code_provenance, package_versions, tally, truncation_counts
from batchgen.models import ModelRef
from batchgen.records import EngineStats, RunTotals, Tally
from tests.provenance_checks import git, sha


def attempt(item_id: str, attempt_no: int, finish_reason: str, failed: list[str], candidate: int = 0) -> dict:
    return {"item_id": item_id, "candidate": candidate, "attempt": attempt_no, "finish_reason": finish_reason,
            "failed": failed, "n_prompt_tokens": 10, "new_output_tokens": 4 * attempt_no}


def window() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Four items: `a` cut off and accepted on its retry, `b` accepted at once, `c` cut off twice and rejected,
    `d` rejected at the prompt stage before the engine saw it."""
    attempts = pd.DataFrame([
        attempt("a", 1, "length", ["truncated"]), attempt("a", 2, "stop", []),
        attempt("b", 1, "stop", []),
        attempt("c", 1, "length", ["truncated"]), attempt("c", 2, "length", ["truncated", "keyword"]),
    ])
    accepted = pd.DataFrame([{"item_id": "a", "candidate": 0, "attempt": 2},
                             {"item_id": "b", "candidate": 0, "attempt": 1}])
    rejected = pd.DataFrame([{"item_id": "c", "reasons": ["truncated", "keyword"]},
                             {"item_id": "d", "reasons": ["prompt_too_long"]}])
    return accepted, rejected, attempts


def test_a_window_tally_counts_each_item_once_with_its_truncation_and_rescue():
    accepted, rejected, attempts = window()

    counted = tally(accepted, rejected, attempts, reused=1)

    assert (counted.items, counted.accepted, counted.rejected) == (4, 2, 2)
    assert counted.generated_items == 3  # d never reached the engine
    assert (counted.truncated_first_pass, counted.truncated_final) == (2, 1)  # a and c cut off; c still at the end
    assert (counted.attempts, counted.retry_attempts, counted.reused) == (5, 2, 1)
    assert counted.rejected_by_reason == {"keyword": 1, "prompt_too_long": 1, "truncated": 1}
    assert counted.rescued == 1 and counted.rescued_by_reason == {"truncated": 1}
    assert (counted.prompt_tokens, counted.output_tokens) == (50, 4 + 8 + 4 + 4 + 8)
    assert counted.rates().pass_rate == 0.5


def test_truncation_counts_items_not_candidates_and_follow_each_candidates_latest_attempt():
    attempts = pd.DataFrame([
        attempt("a", 1, "length", [], candidate=0), attempt("a", 1, "length", [], candidate=1),
        attempt("a", 2, "stop", [], candidate=0),  # candidate 1 was never retried: a is still cut off
        attempt("b", 1, "length", []), attempt("b", 2, "stop", []),
    ])
    assert truncation_counts(attempts) == (2, 1)
    assert truncation_counts(attempts.iloc[0:0]) == (0, 0)


def test_a_window_of_only_rejections_tallies_without_attempts():
    rejected = pd.DataFrame([{"item_id": "x", "reasons": ["missing_field"]}])
    empty = pd.DataFrame(columns=["item_id", "candidate", "attempt", "finish_reason", "failed"])

    counted = tally(pd.DataFrame(columns=["item_id", "candidate", "attempt"]), rejected, empty)

    assert (counted.items, counted.accepted, counted.rejected, counted.generated_items) == (1, 0, 1, 0)
    assert counted.rejected_by_reason == {"missing_field": 1} and counted.rescued_by_reason == {}
    assert (counted.attempts, counted.prompt_tokens, counted.output_tokens) == (0, 0, 0)


def test_package_versions_name_the_installed_ones_and_leave_out_absent_ones():
    versions = package_versions(("pandas", "no-such-distribution-batchgen"))
    assert versions == {"pandas": pd.__version__}


COUNTED = {"items": 3, "accepted": 2, "rejected": 1, "generated_items": 3, "truncated_first_pass": 1,
           "truncated_final": 0, "attempts": 4, "retry_attempts": 1, "rejected_by_reason": {"keyword": 1},
           "prompt_tokens": 60, "output_tokens": 40}


def test_manifest_records_prompt_input_model_software_and_code(tmp_path, hash_cache):
    from tests.unit.conftest import cached_default_model

    data = tmp_path / "items.csv"
    data.write_text("id,name\n1,Mug\n2,Lamp\n3,Kettle\n", encoding="utf-8")
    model = tmp_path / "model"
    model.mkdir()
    for path in cached_default_model().iterdir():  # the default model's files, linked rather than copied (500 MB)
        (model / path.name).symlink_to(path)
    job = job_from_dict({
        "input": {"path": str(data), "id_column": "id"},
        "prompt": {"system": "You write copy.", "template": "Describe {{ name }}."},
        "engine": {"model": str(model), "dtype": "bfloat16"},
        "output": {"dir": str(tmp_path / "out")},
    })
    totals = RunTotals(tally=Tally(**COUNTED), model=ModelRef(name="model", path=str(model)),
                       engine=EngineStats(fresh_output_tokens=40, engine_args={"dtype": "bfloat16", "seed": 0}))
    manifest = build_manifest(job, totals, {"engine_calls": 2.0}, datetime.now(timezone.utc), None)

    prompt = manifest["prompt"]
    assert prompt["template"] == "Describe {{ name }}." and prompt["system"] == "You write copy."
    assert prompt["template_sha256"] == sha(b"Describe {{ name }}.")
    assert prompt["system_sha256"] == sha(b"You write copy.")

    assert manifest["input_file"] == {"path": str(data), "rows_read": 3, "size_bytes": data.stat().st_size,
                                      "sha256": sha(data.read_bytes())}

    recorded = manifest["model"]
    assert recorded["source"] == "folder"
    weights = next(model.glob("*.safetensors"))
    assert recorded["files"][weights.name] == sha(weights.read_bytes())
    assert recorded["files_sha256"] == provenance.folder_sha256(model)[0]

    # No engine ran in this process: the dtype vLLM used is unknown, and says so rather than repeating the job's.
    assert manifest["engine_loaded"]["dtype"] is None and manifest["engine_loaded"]["dtype_requested"] == "bfloat16"
    assert {"vllm", "torch", "cuda", "python"} <= set(manifest["versions"])
    assert manifest["machine"]["device"] in ("cpu", "cuda") and manifest["machine"]["device_names"]
    code = manifest["code"]
    root = Path(provenance.__file__).resolve().parents[1]
    if (root / ".git").exists():  # a checkout (a worktree has a .git file): its commit
        assert code["commit"] == git(root, "rev-parse", "HEAD")


def test_the_code_git_state_is_looked_up_once_per_process_in_the_background():
    first = code_provenance()
    assert code_provenance() is first  # one lookup; the run's manifest waits for it only if it is not done yet
    folder = Path(__file__).resolve().parents[3] / "batchgen"
    assert first.result(timeout=60) == provenance.git_provenance(folder)
