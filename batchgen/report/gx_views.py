"""GX's Data Docs page views, with their Jinja templates compiled once per process.

GX's views (`DefaultJinjaPageView`, `DefaultJinjaIndexPageView`) each make a Jinja environment of their own, so
every page of every site build compiles GX's templates again: most of a Data Docs build's time. These views are
GX's own, rendering the same pages, with one process-wide bytecode cache: a template is compiled the first time
a process needs it, and loaded from memory after (keyed by its name and file, checked against its source, as
Jinja's bytecode caches are). `batchgen.report.datadocs` names them in its site's configuration; `warm()`
compiles the templates ahead, while the run works.
"""

from __future__ import annotations

import threading

from great_expectations.render.view import DefaultJinjaIndexPageView, DefaultJinjaPageView
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket


class MemoryBytecodeCache(BytecodeCache):
    """Compiled templates in memory, for the life of the process."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def load_bytecode(self, bucket: Bucket) -> None:
        with self._lock:
            code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)  # a source that changed since (another checksum) is compiled again

    def dump_bytecode(self, bucket: Bucket) -> None:
        code = bucket.bytecode_to_string()
        with self._lock:
            self._code[bucket.key] = code

    def clear(self) -> None:
        with self._lock:
            self._code.clear()

    def __len__(self) -> int:
        return len(self._code)


COMPILED = MemoryBytecodeCache()


class CachedPageView(DefaultJinjaPageView):
    """GX's page view (the suite's and each validation's page), its templates compiled once per process."""

    def __init__(self, custom_styles_directory=None, custom_views_directory=None) -> None:
        super().__init__(custom_styles_directory, custom_views_directory)
        self.env.bytecode_cache = COMPILED


class CachedIndexPageView(DefaultJinjaIndexPageView):
    """GX's index page view, its templates compiled once per process."""

    def __init__(self, custom_styles_directory=None, custom_views_directory=None) -> None:
        super().__init__(custom_styles_directory, custom_views_directory)
        self.env.bytecode_cache = COMPILED


def warm() -> None:
    """Import GX's site builder and compile its page templates and stylesheets into the cache (a few tenths of a
    second), so that the first Data Docs build of the process does not."""
    import great_expectations.render.renderer.site_builder  # noqa: F401

    env = CachedPageView().env
    for name in env.list_templates():  # the views' templates and the styles they render into the pages
        env.get_template(name)
