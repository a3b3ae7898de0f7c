"""GX Data Docs that read offline: no request leaves the machine, and the pages are still styled.

GX's site builder links Bootstrap, jQuery, bootstrap-table, Font Awesome and Vega from CDNs and builds its
index table with JavaScript; offline the index is blank and every page unstyled. Here, after GX has built
the site: the CDN links and the scripts that need them are removed, a small local stylesheet covers the
Bootstrap classes the pages use, remote logos point at the site's own copy, the index gets a static table
of the validation pages, and static files no page refers to (GX's fonts and tutorial images) are deleted.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from pathlib import Path

STYLESHEET = "static/styles/batchgen-offline.css"
LOGO = "static/images/logo-long.png"

_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']https?://[^>]*>\s*</script>", re.I | re.S)
_REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref=[\"']https?://[^>]*>", re.I | re.S)
_INLINE_SCRIPT = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*</script>", re.I | re.S)
_REMOTE_IMG = re.compile(r"(<img\b[^>]*\bsrc=)[\"']https?://[^\"']*[\"']", re.I | re.S)
_INDEX_TABLE = re.compile(r"<table\b[^>]*data-toggle=[\"']table[\"'][^>]*>\s*</table>", re.I | re.S)
# No script runs on these pages: GX's own only drive the CDN libraries (jQuery, bootstrap-table, Vega), and GX
# writes unexpected values (model outputs) into the pages without escaping them, so an output holding a <script>
# or an onerror= attribute would run when the page is opened. The policy forbids scripts and any request but
# the site's own files.
POLICY = ("default-src 'none'; img-src file: data:; style-src file: 'unsafe-inline'; font-src file: data:; "
          "script-src 'none'")

CSS = """/* batchgen: the Bootstrap 4 classes GX's Data Docs use, so that the pages read styled without a CDN. */
*, ::before, ::after { box-sizing: border-box; }
body { margin: 0; font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; font-size: .9rem;
       line-height: 1.45; color: #212529; background: #fff; }
a { color: #0062cc; text-decoration: none; } a:hover { text-decoration: underline; }
h1, h2, h3, h4, h5, h6 { margin: .4rem 0 .6rem; font-weight: 600; line-height: 1.2; }
h1 { font-size: 1.7rem; } h2 { font-size: 1.4rem; } h3 { font-size: 1.2rem; } h4, h5, h6 { font-size: 1rem; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .85em; color: #a0225a; }
pre { white-space: pre-wrap; }
.container, .container-fluid { width: 100%; padding: 0 15px; margin: 0 auto; }
.row { display: flex; flex-wrap: wrap; margin: 0 -15px; }
[class^="col"], [class*=" col"] { position: relative; width: 100%; padding: 0 15px; }
@media (min-width: 768px) {
  .col-md-2 { flex: 0 0 16.67%; max-width: 16.67%; } .col-md-10 { flex: 0 0 83.33%; max-width: 83.33%; }
  .col-md-6 { flex: 0 0 50%; max-width: 50%; } .col-md-4 { flex: 0 0 33.3%; max-width: 33.3%; }
  .col-md-8 { flex: 0 0 66.7%; max-width: 66.7%; } .d-md-block { display: block !important; }
}
.col-12 { flex: 0 0 100%; max-width: 100%; }
.d-none { display: none; } .d-flex { display: flex; } .d-block { display: block; } .float-left { float: left; }
/* no script opens them offline: collapsed sections ("Show more info") stay open */
.collapse { display: block; } .sticky-top, .sticky { position: sticky; top: 0; z-index: 10; }
.navbar { display: flex; flex-wrap: wrap; align-items: center; padding: .5rem 1rem; border-bottom: 1px solid #dee2e6;
          background: #f8f9fa; }
.navbar-brand img { height: 28px; } .nav { display: flex; flex-direction: column; padding: 0; list-style: none; }
.nav-link { display: block; padding: .3rem .5rem; } .nav-link.active { font-weight: 600; }
.breadcrumb { display: flex; flex-wrap: wrap; list-style: none; padding: .4rem 0; margin: 0; background: none; }
.breadcrumb-item + .breadcrumb-item::before { content: "/"; padding: 0 .4rem; color: #6c757d; }
.card { border: 1px solid rgba(0,0,0,.125); border-radius: .25rem; margin-bottom: 1rem; background: #fff; }
.card-header { padding: .5rem 1rem; background: #f7f7f7; border-bottom: 1px solid rgba(0,0,0,.125); }
.card-body { padding: .8rem 1rem; }
.table, table { width: 100%; border-collapse: collapse; margin-bottom: 1rem; }
.table th, .table td, table th, table td { padding: .45rem .5rem; border-top: 1px solid #dee2e6; vertical-align: top;
                                          text-align: left; }
.table thead th, table thead th { border-bottom: 2px solid #dee2e6; background: #fafafa; }
.table-sm th, .table-sm td { padding: .25rem .4rem; } .table-bordered th, .table-bordered td { border: 1px solid #dee2e6; }
.table-responsive { display: block; width: 100%; overflow-x: auto; }
.alert { padding: .6rem 1rem; margin-bottom: 1rem; border: 1px solid transparent; border-radius: .25rem; }
.alert-secondary { color: #383d41; background: #e2e3e5; } .alert-danger { color: #721c24; background: #f8d7da; }
.alert-success { color: #155724; background: #d4edda; } .alert-warning { color: #856404; background: #fff3cd; }
.badge { display: inline-block; padding: .2em .45em; font-size: 80%; font-weight: 600; border-radius: .25rem;
         background: #6c757d; color: #fff; }
.badge-success { background: #28a745; } .badge-danger { background: #dc3545; } .badge-info { background: #17a2b8; }
.btn { display: inline-block; padding: .25rem .6rem; border: 1px solid #6c757d; border-radius: .25rem; color: #333;
       background: #fff; font-size: .85rem; } .btn-primary { border-color: #0062cc; color: #0062cc; }
.text-success { color: #28a745 !important; } .text-danger { color: #dc3545 !important; }
.text-muted { color: #6c757d !important; } .bg-light { background: #f8f9fa; }
.m-0 { margin: 0 !important; } .p-0 { padding: 0 !important; } .mb-0 { margin-bottom: 0 !important; }
.mb-1 { margin-bottom: .25rem; } .mb-4 { margin-bottom: 1.5rem; } .mt-1 { margin-top: .25rem; }
.mt-3 { margin-top: 1rem; } .m-2 { margin: .5rem; } .p-1 { padding: .25rem; } .p-2 { padding: .5rem; }
.pt-4 { padding-top: 1.5rem; } .pb-4 { padding-bottom: 1.5rem; } .ml-1 { margin-left: .25rem; }
.ml-2 { margin-left: .5rem; }
.fas::before, .far::before, .fa::before { font-style: normal; font-weight: 700; }
.fa-check-circle::before, .fa-check::before { content: "\\2714"; color: #28a745; }
.fa-times::before, .fa-times-circle::before { content: "\\2718"; color: #dc3545; }
.fa-exclamation-triangle::before { content: "\\26A0"; } .fa-info-circle::before { content: "\\2139"; }
.ge-index-static th { white-space: nowrap; }
.invisible, .modal, [id$="-table-toolbar"] { display: none !important; }
.fixed-bottom { position: static; } footer { padding: .5rem 1rem; color: #6c757d; font-size: .8rem; }
"""


@dataclass
class Page:
    """One validation page of the site, for the index's static table."""

    label: str
    href: str  # relative to the site folder
    success: bool | None
    evaluated: int | None
    successful: int | None


def _relative(page: Path, site: Path, target: str) -> str:
    return Path(os.path.relpath(site / target, page.parent)).as_posix()


def _index_table(pages: list[Page], suite_href: str | None) -> str:
    rows = []
    for page in pages:
        status = ("<span class='text-success'>passed</span>" if page.success
                  else "<span class='text-danger'>failed</span>" if page.success is not None else "")
        counts = (f"{page.successful} of {page.evaluated}" if page.evaluated is not None else "")
        rows.append(f"<tr><td>{status}</td><td><a href='{html.escape(page.href)}'>{html.escape(page.label)}</a></td>"
                    f"<td>{counts}</td></tr>")
    suite = (f"<p>Expectation suite: <a href='{html.escape(suite_href)}'>{html.escape(Path(suite_href).stem)}</a></p>"
             if suite_href else "")
    return (f"{suite}<table class='table table-sm ge-index-static'><thead><tr><th>status</th><th>validation</th>"
            f"<th>expectations met</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def make_offline(site: Path, pages: list[Page], suite_href: str | None = None) -> None:
    """Rewrite every page of the built site so that it reads offline, styled; then drop unreferenced files."""
    site = Path(site)
    (site / STYLESHEET).parent.mkdir(parents=True, exist_ok=True)
    (site / STYLESHEET).write_text(CSS, encoding="utf-8")
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        text = _REMOTE_SCRIPT.sub("", text)
        text = _REMOTE_LINK.sub("", text)
        text = _INLINE_SCRIPT.sub("", text)
        text = _REMOTE_IMG.sub(lambda m: f'{m.group(1)}"{_relative(page, site, LOGO)}"', text)
        if page == site / "index.html":
            text = _INDEX_TABLE.sub(lambda m: _index_table(pages, suite_href), text, count=1)
        stylesheet = f'<link rel="stylesheet" href="{_relative(page, site, STYLESHEET)}">'
        text = re.sub(r"</head>", stylesheet + "\n</head>", text, count=1, flags=re.I)
        text = re.sub(r"<head>", f'<head>\n<meta http-equiv="Content-Security-Policy" content="{POLICY}">', text,
                      count=1, flags=re.I)
        page.write_text(text, encoding="utf-8")
    drop_unreferenced(site)


def drop_unreferenced(site: Path) -> None:
    """Delete static files (fonts, images, styles) that no page or stylesheet refers to by name."""
    texts = "".join(path.read_text(encoding="utf-8", errors="replace")
                    for pattern in ("*.html", "*.css") for path in site.rglob(pattern))
    static = site / "static"
    for path in sorted(static.rglob("*"), reverse=True) if static.is_dir() else []:
        if path.is_file() and path.name not in texts:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
