"""The layers of toolledger/: no import circles, the runtime on its port, integrations on the
runtime's public names, and an embedded ledger that loads no driver.

docs/architecture.md ("Layout") states these; a change that breaks one fails here, naming the
module and the import, rather than showing up later as a slow `import toolledger`, an import
error in one order of imports only, or an adapter that cannot be swapped.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import toolledger
import toolledger.runtime

PACKAGE = Path(toolledger.runtime.__file__).resolve().parents[1]
ROOT = PACKAGE.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(
    body: list[ast.stmt], *, typing: bool
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its top level, and the branches of
    top-level `if`/`try` blocks, but not function bodies; `if TYPE_CHECKING:` only if
    `typing` (the modules a module's annotations name)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and (typing or not _is_type_checking(node)):
            yield from _import_time_nodes(node.body, typing=typing)
            yield from _import_time_nodes(node.orelse, typing=typing)
        elif isinstance(node, ast.Try):
            yield from _import_time_nodes(node.body, typing=typing)
            for handler in node.handlers:
                yield from _import_time_nodes(handler.body, typing=typing)


def imports_of(module: str, *, typing: bool = False) -> set[tuple[str, str]]:
    """(imported module, name) pairs that `module` imports at import time (with `typing`, for
    its annotations too), resolved to toolledger modules where the name is itself a module."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[tuple[str, str]] = set()
    for node in _import_time_nodes(tree.body, typing=typing):
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            found.add((submodule, "") if submodule in MODULES else (base, alias.name))
    return found


def _graph() -> dict[str, set[str]]:
    """Which toolledger modules each one imports, for its annotations too."""
    return {
        module: {t for t, _ in imports_of(module, typing=True) if t in MODULES} - {module}
        for module in MODULES
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_toolledger_has_no_import_circles() -> None:
    """A circle works in one import order and fails in another, or hides behind a
    TYPE_CHECKING guard (the ledger <-> pipelined one did), and it welds two modules into one
    that cannot be understood, or replaced, alone. Annotations count; call-time imports (the
    lazy ones of the wiring and the CLI) do not."""
    assert _cycles(_graph()) == []


def test_the_runtime_imports_no_storage_wiring_or_settings() -> None:
    """The runtime stands on its port: it imports neither the stack, the settings, the
    projections nor the wiring when it is imported. `Ledger.memory()` and `Ledger.connect()`
    ask the wiring when they are called, the one place that chooses adapters."""
    forbidden = ("toolledger.projections", "toolledger.settings", "toolledger.wiring")
    reached = {
        (module, target)
        for module in MODULES
        if module.startswith("toolledger.runtime")
        for target, _ in imports_of(module)
        if target.startswith(forbidden)
    }
    assert reached == set()


def test_integrations_import_only_the_runtimes_public_names() -> None:
    """An adapter that reaches into `toolledger.runtime.ledger` or the projections breaks when
    those move; it may use `toolledger`, `toolledger.runtime`'s `__all__`, its own package."""
    public = {("toolledger.runtime", n) for n in toolledger.runtime.__all__}
    public |= {("toolledger", n) for n in toolledger.__all__}
    wrong = set()
    for module in MODULES:
        if not module.startswith("toolledger.integrations"):
            continue
        for target, name in imports_of(module):
            if not target.startswith("toolledger") or target.startswith("toolledger.integrations"):
                continue
            if (target, name) in public:
                continue
            wrong.add((module, f"{target}.{name}" if name else target))
    assert wrong == set()


def test_an_embedded_ledger_loads_neither_kafka_nor_postgres_drivers() -> None:
    """`import toolledger` and `Ledger.memory()` is the embedded default (the demo, users' unit
    tests): loading aiokafka and asyncpg for it cost a third of the import time."""
    script = (
        "import asyncio, sys\n"
        "import toolledger\n"
        "async def main():\n"
        "    ledger = await toolledger.Ledger.memory()\n"
        "    await ledger.close()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in ('aiokafka', 'asyncpg') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr
