"""`batchgen report` as a user meets it: rebuild a finished run's report, a clear error on any other folder."""

from __future__ import annotations

import re

from tests.test_cli import run_cli
from tests.unit.batchgen.report.publication import make_publication


def test_report_help_says_what_it_reads_and_writes(tmp_path):
    result = run_cli(["report", "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    for words in ("RUN_DIR", "report.html", "data_docs", "current", "manifest.json", "Exit code 4"):
        assert words in result.stdout, words
    assert "report" in run_cli(["--help"], tmp_path).stdout


def test_report_rebuilds_a_publication_and_follows_current(tmp_path):
    out = tmp_path / "out"
    publication = out / "publications" / "20261129T120000000000Z-test"
    manifest = make_publication(publication)
    (out / "current").symlink_to(publication.relative_to(out))

    result = run_cli(["report", str(out)], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(publication.resolve() / "report.html")
    page = (publication / "report.html").read_text(encoding="utf-8")
    assert re.search(rf'data-count="accepted">{manifest["counts"]["accepted"]}<', page)
    assert (publication / "data_docs" / "index.html").is_file()


def test_report_on_a_folder_that_is_not_a_publication_exits_4(tmp_path):
    (tmp_path / "notes.txt").write_text("not a run", encoding="utf-8")
    for target, message in ((tmp_path, "missing manifest.json"), (tmp_path / "absent", "is not a directory")):
        result = run_cli(["report", str(target)], tmp_path)
        assert result.returncode == 4, result.stderr
        assert message in result.stderr and str(target) in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "report.html").exists()
