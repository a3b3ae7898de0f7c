"""The code's layers: no import loop, and no module imports one of a layer above its own.

Bottom to top: the job config and the records (with the few small modules they need); batchgen's data, engine
and I/O modules; the GX suites (`expectations`); the report (it draws the suites' Data Docs); the Prefect tasks;
the flows and deployments; the CLI. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("batchgen", "expectations", "tasks", "flows", "deployments")
BOTTOM = {"batchgen", "batchgen.job", "batchgen.records", "batchgen.files", "batchgen.urls",
          "batchgen.gx_expectations", "batchgen.gx_results", "batchgen.vllm_sampling"}
LAYERS = [("bottom", lambda m: m in BOTTOM), ("cli", lambda m: m == "batchgen.cli"),
          ("report", lambda m: m.startswith("batchgen.report")), ("batchgen", lambda m: m.startswith("batchgen.")),
          ("expectations", lambda m: m.startswith("expectations")), ("tasks", lambda m: m.startswith("tasks")),
          ("flows", lambda m: m.startswith(("flows", "deployments")))]
ORDER = ["bottom", "batchgen", "expectations", "report", "tasks", "flows", "cli"]


def layer(module: str) -> int:
    return ORDER.index(next(name for name, test in LAYERS if test(module)))


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(known: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a project module, at any depth of the code but `__main__` blocks
    and `if TYPE_CHECKING:` (imports for type hints only)."""
    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges = set()
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        main_blocks = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and ("__main__" in ast.dump(node.test) or "TYPE_CHECKING" in ast.dump(node.test))
                       for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in main_blocks:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                found = resolve(target)
                if found and found != name:
                    edges.add((name, found))
    return edges


def test_no_module_imports_a_layer_above_its_own():
    known = modules()
    upward = sorted(f"{a} ({ORDER[layer(a)]}) imports {b} ({ORDER[layer(b)]})"
                    for a, b in imports(known) if layer(b) > layer(a))
    assert upward == []


def test_there_is_no_import_loop():
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for a, b in imports(known):
        graph[a].add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    loops = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                loops.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert loops == []


def test_the_layers_are_those_of_the_docstring():
    assert [layer(m) for m in ("batchgen.records", "batchgen.publish", "expectations.suite",
                               "batchgen.report.datadocs", "tasks.publish", "flows.batch_generation",
                               "deployments.register", "batchgen.cli")] == [0, 1, 2, 3, 4, 5, 5, 6]
