"""The package's shape, read from its source: no import circle, modules and classes of a readable size,
backend differences kept inside the backends, and the docs' layout table in step with the files."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sift"
BACKENDS = "sift.dcache.backends"

#: The most lines a module in ``sift/`` may have: what keeps one concept in one file (a module past it holds
#: two, or one that should be split by its parts). The one module allowed more: the design keeps every rule
#: in one module, beside the statements its functions run.
MODULE_LINES = 800
RULES_MODULE, RULES_MODULE_LINES = "sift.dcache.manager", 1_000
CLASS_LINES = 300


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that runs (in a function too), leaving out ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and is_type_checking(node):
            yield from (n for orelse in node.orelse for n in runtime_imports(ast.Module([orelse], [])))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from runtime_imports(node)


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``sift`` that module ``name`` imports when it runs (a name imported from a package
    counts as its submodule when it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in runtime_imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
            continue
        base = package
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        if node.level:
            source: str | None = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module
        if source is None or not source.startswith("sift"):
            continue
        for alias in node.names:
            found.add(submodule if (submodule := f"{source}.{alias.name}") in known else source)
    found.discard(name)
    return {module for module in found if module in known}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as the list of its modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_a_circle_and_its_absence() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle_in_the_package() -> None:
    graph = import_graph()
    assert "sift.dcache.manager" in graph["sift.dcache"], "the walk must see the package's own imports"
    assert find_cycle(graph) is None


def test_module_and_class_sizes() -> None:
    """Every module of the package and every class in it, one case: it names each one over its limit."""
    found = modules()
    assert RULES_MODULE in found, "the walk must see the package's modules"
    over = []
    for name, path in found.items():
        source = path.read_text()
        limit = RULES_MODULE_LINES if name == RULES_MODULE else MODULE_LINES
        if len(source.splitlines()) > limit:
            over.append(f"{path.relative_to(ROOT)} is over {limit} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > CLASS_LINES:
                    over.append(f"class {node.name} in {name} has {lines} lines")
    assert over == []


def test_backend_modules_are_imported_only_inside_the_backends() -> None:
    """Outside ``sift.dcache.backends`` only the protocol package is imported; the package's ``__init__``
    may re-export a public backend class."""
    graph = import_graph()
    backend_modules = {m for m in graph if m.startswith(f"{BACKENDS}.")}
    assert backend_modules, "the backends live in packages of their own"
    for name, targets in graph.items():
        if name == BACKENDS or name.startswith(f"{BACKENDS}.") or name == "sift.dcache":
            continue
        assert not targets & backend_modules, f"{name} imports {sorted(targets & backend_modules)}"


def test_no_backend_imports_another() -> None:
    """Each backend package imports no module of another backend's: what they share lives above them."""
    graph = import_graph()
    backends = {m.split(".")[3] for m in graph if m.startswith(f"{BACKENDS}.") and m.count(".") >= 4}
    assert {"sqlite", "postgres"} <= backends, "the walk must see both backends' packages"
    for name, targets in graph.items():
        if not name.startswith(f"{BACKENDS}.") or name.count(".") < 3:
            continue
        own = name.split(".")[3]
        if own not in backends:
            continue
        others = {t for t in targets if t.startswith(f"{BACKENDS}.") and t.split(".")[3] in backends - {own}}
        assert not others, f"{name} imports {sorted(others)}"


@pytest.mark.slow
def test_no_private_member_of_a_backend_outside_the_backends() -> None:
    for name, path in modules().items():
        if name.startswith(BACKENDS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
                owner = ast.unparse(node.value)
                assert not re.search(r"\b(db|backend|database)\b", owner), (
                    f"{name} line {node.lineno} reaches a private member: {ast.unparse(node)}"
                )


# The layout table of docs/explanation/layout.md: one row per path, a folder (ending in /) for what it holds.

LAYOUT_ROW = re.compile(r"^\| `([^`]+)` \|")


def layout_rows() -> list[str]:
    section = (ROOT / "docs" / "explanation" / "layout.md").read_text()
    return [match[1] for line in section.splitlines() if (match := LAYOUT_ROW.match(line))]


def test_layout_table_names_existing_paths_once() -> None:
    rows = layout_rows()
    assert rows, "docs/explanation/layout.md has a layout table"
    assert len(rows) == len(set(rows))
    for row in rows:
        path = ROOT / row
        assert path.is_dir() if row.endswith("/") else path.is_file(), f"the layout names {row}, not there"
    folders = [row for row in rows if row.endswith("/")]
    for row in rows:
        inside = [folder for folder in folders if row != folder and row.startswith(folder)]
        assert not inside, f"{row} is already covered by {inside}"


def test_layout_table_covers_every_module() -> None:
    rows = layout_rows()
    folders = [row for row in rows if row.endswith("/")]
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in {"__init__.py", "__main__.py"}:
            continue
        relative = path.relative_to(ROOT).as_posix()
        covered = relative in rows or any(relative.startswith(folder) for folder in folders)
        assert covered, f"docs/explanation/layout.md's layout table does not name {relative}"


def protocol_members(protocol: type) -> set[str]:
    """The names a protocol class declares itself: its methods, properties and annotated attributes."""
    declared = set(vars(protocol).get("__annotations__", {}))
    declared |= {
        name for name, value in vars(protocol).items() if callable(value) or isinstance(value, property)
    }
    return {name for name in declared if not name.startswith("_")}


def test_the_backend_protocol_is_its_three_parts() -> None:
    """``Backend`` is ``Dialect``, ``Transactions`` and ``Maintenance`` and nothing more, and no member is in
    two of them: a caller can name the one part it needs."""
    from sift.dcache import backends

    parts = [backends.Dialect, backends.Transactions, backends.Maintenance]
    members = [protocol_members(part) for part in parts]
    assert all(members)
    assert sum(len(m) for m in members) == len(set().union(*members)), "a member is in two parts"
    assert protocol_members(backends.Backend) == set()
    assert backends.Backend.__mro__[1:4] == tuple(parts)
    assert {"statement_key", "param", "bytewise"} <= members[0]
    assert {"write", "lock_job", "raise_store_error"} <= members[1]
    assert {"missing_schema", "page_stats", "copy_into"} <= members[2]


#: Every place whose SQL moves a job's ``targets_done``, and why. The counting rule (a target write moves its
#: job's count, bytes and lease by the target's change, read in the same statement) is written once per
#: backend; the other moves count targets whose change they know without reading it.
COUNT_MOVES = {
    "dcache/backends/sqlite/writes.py": "the counting rule, SQLite's statements",
    "dcache/backends/postgres/queries.sql": "the counting rule, PostgreSQL's statement",
    "dcache/claims.py": "a stale claim's last attempt: running targets fail, each counted once",
    "dcache/client.py": "a cancel: the job's open targets fail, each counted once",
    "dcache/retries.py": "an operator's reopen: failed targets go back to pending, each leaving the count",
}
#: SQL or a Peewee update that sets targets_done from itself (``targets_done = targets_done + …``,
#: ``J.targets_done: J.targets_done - …``, ``SET (targets_done, …) = (SELECT batch_job.targets_done + …``).
COUNT_MOVE = re.compile(r"targets_done\s*[:=]\s*(?:\w+\.)?targets_done\s*[-+]|SET \(targets_done\b")


def test_the_counting_rule_is_written_once_per_backend() -> None:
    moving = {
        path.relative_to(PACKAGE).as_posix()
        for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.sql")]
        if COUNT_MOVE.search(path.read_text(encoding="utf-8"))
    }
    assert moving == set(COUNT_MOVES)
