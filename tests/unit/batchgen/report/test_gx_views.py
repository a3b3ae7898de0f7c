"""GX's page views with their templates compiled once per process (batchgen.report.gx_views): the same Data Docs,
without compiling GX's templates again for every page and every build."""

from __future__ import annotations

import re
import shutil

import jinja2

from batchgen.report import DATA_DOCS, gx_views
from batchgen.report.datadocs import build_data_docs
from batchgen.report.read import load_publication


def site(root) -> dict[str, str]:
    """Every file of the Data Docs, without what differs between any two builds (GX's random element ids, the
    build time in its links)."""
    pages = {}
    for path in sorted((root / DATA_DOCS).rglob("*")):
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", text)
            pages[path.relative_to(root).as_posix()] = re.sub(r"\d{8}T\d{6}\.\d+Z", "TIME", text)
    return pages


def counting_compiles(monkeypatch) -> list[str]:
    compiled = []
    compile_template = jinja2.Environment.compile

    def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
        compiled.append(name)
        return compile_template(self, source, name, filename, raw, defer_init)

    monkeypatch.setattr(jinja2.Environment, "compile", compile)
    return compiled


def test_the_data_docs_are_gx_own_pages_and_its_templates_compile_once(published, tmp_path, monkeypatch):
    root, _, _ = published
    copies = [tmp_path / name for name in ("gx", "first", "again")]
    for copy in copies:
        shutil.copytree(root, copy)
    compiled = counting_compiles(monkeypatch)
    cache = gx_views.COMPILED
    monkeypatch.setattr(gx_views, "COMPILED", None)  # GX's own views: every view compiles what it renders
    build_data_docs(load_publication(copies[0]))
    without_cache = len(compiled)

    monkeypatch.setattr(gx_views, "COMPILED", cache)
    cache.clear()
    compiled.clear()
    build_data_docs(load_publication(copies[1]))
    first = len(compiled)
    compiled.clear()
    build_data_docs(load_publication(copies[2]))
    assert without_cache > first > 0 and compiled == []  # each template once; the second build compiles nothing
    assert site(copies[0]) == site(copies[1]) == site(copies[2])
    assert len(site(copies[0])) >= 4


def test_warming_compiles_the_templates_a_build_needs(published, tmp_path, monkeypatch):
    root, _, _ = published
    shutil.copytree(root, tmp_path / "run")
    gx_views.COMPILED.clear()
    gx_views.warm()
    assert len(gx_views.COMPILED) > 10
    compiled = counting_compiles(monkeypatch)
    build_data_docs(load_publication(tmp_path / "run"))
    assert compiled == []


def test_a_template_whose_source_changed_is_compiled_again():
    cache = gx_views.MemoryBytecodeCache()
    env = jinja2.Environment(loader=jinja2.DictLoader({"page.j2": "one {{ x }}"}), bytecode_cache=cache)
    assert env.get_template("page.j2").render(x=1) == "one 1" and len(cache) == 1
    changed = jinja2.Environment(loader=jinja2.DictLoader({"page.j2": "two {{ x }}"}), bytecode_cache=cache)
    assert changed.get_template("page.j2").render(x=2) == "two 2"
