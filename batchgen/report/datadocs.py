"""GX Data Docs of a run's validation results, built by GX's own site builder into `<run>/data_docs/`.

The site is written with relative links, so the publication folder can be moved or copied as a whole, and
rewritten to read offline (batchgen.report.offline_docs).
"""

from __future__ import annotations

import logging
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from batchgen.report.figures import pass_label
from batchgen.report.offline_docs import Page, make_offline
from batchgen.report.read import Publication

DATA_DOCS = "data_docs"


def build_data_docs(pub: Publication) -> dict[str, Any] | None:
    """GX Data Docs of the run's validation results in `<run>/data_docs/`; None when nothing was validated.

    Returns the pages relative to the run directory: the site index, the suite, one page per pass.
    GX's pages pull their styles and scripts from CDNs: `make_offline` rewrites them to read offline,
    styled by a local stylesheet, with a static index (batchgen.report.offline_docs).
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.core import ExpectationSuiteValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    import expectations.suite  # noqa: F401  (registers batchgen's own expectation classes for rendering)

    site = pub.root / DATA_DOCS
    if site.exists():
        shutil.rmtree(site)
    validated = [(i, r) for i, r in enumerate(pub.validation) if r.get("results") and r.get("suite_name")]
    if not validated:
        return None
    context = gx.get_context(mode="ephemeral")
    # GX's own views, with their templates compiled once per process (batchgen.report.gx_views)
    page_view = {"module_name": "batchgen.report.gx_views", "class_name": "CachedPageView"}
    context.add_data_docs_site("batchgen", {
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder",
                               "view": {"module_name": "batchgen.report.gx_views",
                                        "class_name": "CachedIndexPageView"}},
        "site_section_builders": {"expectations": {"view": page_view}, "validations": {"view": page_view},
                                  "profiling": {"view": page_view}},
    })
    started = pub.started_at or datetime.now(timezone.utc)
    suite_name = validated[0][1]["suite_name"]
    configs = [ExpectationConfiguration(**{k: v for k, v in outcome["expectation_config"].items()
                                           if k not in ("id", "rendered_content")})
               for outcome in validated[0][1]["results"]]
    for config in configs:
        config.kwargs.pop("batch_id", None)
    context.suites.add(gx.ExpectationSuite(name=suite_name, expectations=[c.to_domain_obj() for c in configs]))
    keys = []
    for index, result in validated:
        label = pass_label(index)
        run_id = RunIdentifier(run_name=label.replace(" ", "-"), run_time=started)  # a path part: no spaces
        key = ValidationResultIdentifier(ExpectationSuiteIdentifier(name=result["suite_name"]), run_id,
                                         label.replace(" ", "-"))
        meta = {**(result.get("meta") or {}), "run_id": run_id.to_json_dict()}
        context.validation_results_store.set(key, ExpectationSuiteValidationResult(**{**result, "meta": meta}))
        keys.append((label, key))
    context.build_data_docs(site_names=["batchgen"])

    def relative(identifier) -> str:
        [url] = [u["site_url"] for u in context.get_docs_sites_urls(resource_identifier=identifier,
                                                                     site_name="batchgen")]
        return Path(url.removeprefix("file://")).relative_to(pub.root).as_posix()

    docs = {
        "index": f"{DATA_DOCS}/index.html",
        "suite": relative(ExpectationSuiteIdentifier(name=suite_name)),
        "passes": [{"label": label, "href": relative(key)} for label, key in keys],
    }
    inside = len(DATA_DOCS) + 1  # the pages' paths inside the site folder
    make_offline(site, [Page(label, docs["passes"][i]["href"][inside:], result.get("success"),
                             (result.get("statistics") or {}).get("evaluated_expectations"),
                             (result.get("statistics") or {}).get("successful_expectations"))
                        for i, (label, (_, result)) in enumerate(zip([k[0] for k in keys], validated))],
                 docs["suite"][inside:])
    return docs
