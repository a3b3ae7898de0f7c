"""The dataset card of a publication: its tables, model, template and counts."""

from __future__ import annotations

import yaml

from batchgen.publish import CARD


def test_the_card_names_the_tables_model_template_and_counts(publication):
    out, manifest, _ = publication
    text = (out / "current" / CARD).read_text(encoding="utf-8")
    header = yaml.safe_load(text.split("---\n")[1])
    assert [c["config_name"] for c in header["configs"]] == ["accepted", "rejected", "attempts"]
    assert header["configs"][0]["default"] is True
    assert header["configs"][1]["data_files"] == [{"split": "train", "path": "rejected/*.parquet"}]
    assert "`SmolLM2-135M-Instruct`" in text and "Describe {{ name }}." in text
    assert "| 4 | 2 | 2 |" in text  # items, accepted, rejected
    assert "| duplicate_id | 1 |" in text
    assert "| input_input_text | string | input column `text`, renamed" in text
    assert manifest["files"][CARD]["sha256"]  # the card is part of the verified publication
