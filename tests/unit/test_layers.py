"""The layers of toolledger/: no import circles, the runtime on its port, storage under no
runtime, the leader split by side, integrations on the runtime's public names, and an embedded
ledger that loads no driver.

The floors, bottom up: `toolledger.errors` and `toolledger.events`; the port
(`toolledger.port`); then the runtime, the projections and the leader's runtime side, none of
which imports the others' storage; the wiring, which builds stacks and ports from settings; and
the entry points (CLI, API, server) on top. docs/architecture.md ("Where things live", "The port
is the seam") states these; a change that breaks one fails here, naming the module and the
import, rather than showing up later as a slow `import toolledger`, an import error in one order
of imports only, or an adapter that cannot be swapped.

Every guard reads imports wherever they stand: at module level, under `if TYPE_CHECKING:` (the
modules a module's annotations name) and inside functions (imported when called). One import
is allowed across a floor, and only when called or in annotations, never when a module loads:
`Ledger.memory()`, `Ledger.connect(settings)` and `Ledger.from_stack()` ask the wiring, the
user's front door to the adapters (`LAZY_FRONT_DOOR`). The last tests copy the package, add one
forbidden import, and check each guard names it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

import toolledger
import toolledger.runtime

PACKAGE = Path(toolledger.__file__).resolve().parent

When = Literal["load", "typing", "call"]

#: The one import across a floor: the runtime's `Ledger` asks the wiring for its port when
#: `Ledger.memory()`, `connect()` or `from_stack()` is called, and names `Settings` and
#: `LedgerStack` in their annotations. Never when `toolledger.runtime.ledger` loads.
LAZY_FRONT_DOOR = (
    "toolledger.runtime.ledger",
    ("toolledger.wiring", "toolledger.settings"),
    frozenset({"call", "typing"}),
)


@dataclass(frozen=True)
class Import:
    """`module` imports `target` (a module of the tree where the name is one; else the module
    the name comes from, and `name`) when it loads, in annotations only, or when called."""

    module: str
    target: str
    name: str
    when: When


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST, when: When) -> Iterator[tuple[ast.Import | ast.ImportFrom, When]]:
    """Every import statement below `node`, with when it runs."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, when
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _import_nodes(child, "typing" if when == "typing" else "call")
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield from _import_nodes(ast.Module(body=[statement], type_ignores=[]), "typing")
            for statement in child.orelse:
                yield from _import_nodes(ast.Module(body=[statement], type_ignores=[]), when)
        else:
            yield from _import_nodes(child, when)


_READ: dict[tuple[str, str], list[Import]] = {}


class Tree:
    """The modules of the package at `package` (a directory) and the imports of each."""

    def __init__(self, package: Path) -> None:
        root = package.parent
        self.modules: dict[str, Path] = {}
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        self._imports: dict[str, list[Import]] = {}

    def imports(self, module: str) -> list[Import]:
        if module not in self._imports:
            source = self.modules[module].read_text()
            if (module, source) not in _READ:  # the copies below share most sources
                _READ[module, source] = list(self._read(module, source))
            self._imports[module] = _READ[module, source]
        return self._imports[module]

    def _read(self, module: str, source: str) -> Iterator[Import]:
        path = self.modules[module]
        for node, when in _import_nodes(ast.parse(source), "load"):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, alias.name, "", when)
                continue
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in self.modules:
                    yield Import(module, submodule, "", when)
                else:
                    yield Import(module, base, alias.name, when)

    def crossing(self, below: str, into: tuple[str, ...]) -> set[Import]:
        """Every import by a module under `below` of a module under one of `into`."""
        return {
            found
            for module in self.modules
            if _under(module, below)
            for found in self.imports(module)
            if any(_under(found.target, place) for place in into)
        }


def _under(module: str, place: str) -> bool:
    return module == place or module.startswith(f"{place}.")


def circles(tree: Tree) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), every import counted."""
    graph = {
        module: {i.target for i in tree.imports(module) if i.target in tree.modules} - {module}
        for module in tree.modules
    }
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


def runtime_below_its_port(tree: Tree) -> set[Import]:
    """The runtime's imports of storage, settings or the wiring, but the front door's."""
    module, places, whens = LAZY_FRONT_DOOR
    return {
        i
        for i in tree.crossing(
            "toolledger.runtime",
            ("toolledger.projections", "toolledger.settings", "toolledger.wiring"),
        )
        if not (i.module == module and any(_under(i.target, p) for p in places) and i.when in whens)
    }


def projections_on_the_runtime(tree: Tree) -> set[Import]:
    """The projections' imports of the runtime or the settings: storage serves every caller
    (the runtime, the API, the processors) and is configured by whoever builds it."""
    return tree.crossing(
        "toolledger.projections", ("toolledger.runtime", "toolledger.settings", "toolledger.wiring")
    )


def leader_runtime_side_on_the_projector(tree: Tree) -> set[Import]:
    """The leader's runtime side's imports of the projector side, the projections or the
    wiring: a runtime process must not load the leader it talks to."""
    return tree.crossing(
        "toolledger.leader.runtime_side",
        (
            "toolledger.leader.projector_side",
            "toolledger.projections",
            "toolledger.wiring",
            "toolledger.settings",
        ),
    )


@pytest.fixture(scope="module")
def tree() -> Tree:
    return Tree(PACKAGE)


def test_toolledger_has_no_import_circles(tree: Tree) -> None:
    """A circle works in one import order and fails in another, or hides behind a
    TYPE_CHECKING guard (the ledger <-> pipelined one did) or a call-time import (the leader's
    port <-> the wiring's stack one did), and it welds modules into one that cannot be
    understood, or replaced, alone."""
    assert circles(tree) == []


def test_the_runtime_imports_no_storage_wiring_or_settings(tree: Tree) -> None:
    """The runtime stands on its port (`toolledger.port`): it imports neither the stack, the
    settings, the projections nor the wiring, when it loads or when it runs; `Ledger`'s front
    door (`LAZY_FRONT_DOOR`) is the one place it asks the wiring, when called."""
    assert runtime_below_its_port(tree) == set()


def test_the_projections_import_nothing_of_the_runtime_or_settings(tree: Tree) -> None:
    """Storage is below the runtime: what both share (`CallQuery`, `LedgerUnavailable`,
    `ConfigError`) is on the floor under both (`toolledger.port`, `toolledger.errors`)."""
    assert projections_on_the_runtime(tree) == set()


def test_the_leaders_runtime_side_imports_nothing_of_the_projector_side(tree: Tree) -> None:
    """`LeaderPort` runs in runtime processes: it reaches the stack under its direct path
    through `DirectServices` and the leaders' addresses through `LeaderAddresses`, both given
    by the wiring, never by importing them."""
    assert leader_runtime_side_on_the_projector(tree) == set()


def test_the_leaders_runtime_side_loads_no_projector_code() -> None:
    """What the guard above reads from the source, measured in a fresh interpreter: importing
    the runtime side once loaded 31 modules of the leader, the projections and the wiring,
    and asyncpg."""
    script = (
        "import sys\n"
        "import toolledger.leader.runtime_side.connection\n"
        "import toolledger.leader.runtime_side.port\n"
        "heavy = ('toolledger.projections', 'toolledger.wiring', 'toolledger.settings',\n"
        "         'toolledger.leader.projector_side', 'toolledger.runtime',\n"
        "         'asyncpg', 'aiokafka')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr


#: The one internal seam the adapters share with `AgentRun`, kept out of the runtime's public
#: `__all__`: the call-policy layer, and the identity of the call it makes.
ADAPTER_SEAM = {
    ("toolledger.runtime.policy", "drive_call"),
    ("toolledger.runtime.pipeline", "identity"),
}


def test_integrations_import_only_the_runtimes_public_names(tree: Tree) -> None:
    """An adapter that reaches into `toolledger.runtime.ledger` or the projections breaks when
    those move; it may use `toolledger`, `toolledger.runtime`'s `__all__`, its own package,
    and the call-policy seam (`ADAPTER_SEAM`)."""
    public = {("toolledger.runtime", n) for n in toolledger.runtime.__all__}
    public |= {("toolledger", n) for n in toolledger.__all__} | ADAPTER_SEAM
    wrong = set()
    for module in tree.modules:
        if not _under(module, "toolledger.integrations"):
            continue
        for i in tree.imports(module):
            if i.when == "typing" or not _under(i.target, "toolledger"):
                continue
            if _under(i.target, "toolledger.integrations") or (i.target, i.name) in public:
                continue
            wrong.add((module, f"{i.target}.{i.name}" if i.name else i.target))
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


# -- each guard fails on the import it forbids ------------------------------------------------

_CALLED = "\n\ndef _added() -> None:\n    {}\n"
_TYPING = "\n\nif TYPE_CHECKING:\n    {}\n"

#: (guard, module file, what is added to it, the import the guard must then report).
FORBIDDEN = {
    "runtime loads projections": (
        runtime_below_its_port,
        "runtime/outcome.py",
        "\nfrom toolledger.projections.store import StoreError\n",
        Import("toolledger.runtime.outcome", "toolledger.projections.store", "StoreError", "load"),
    ),
    "runtime calls into settings": (
        runtime_below_its_port,
        "runtime/pipeline.py",
        _CALLED.format("from toolledger.settings import Settings"),
        Import("toolledger.runtime.pipeline", "toolledger.settings", "Settings", "call"),
    ),
    "Ledger loads the wiring at import": (
        runtime_below_its_port,
        "runtime/ledger.py",
        "\nfrom toolledger.wiring import memory_port\n",
        Import("toolledger.runtime.ledger", "toolledger.wiring", "memory_port", "load"),
    ),
    "projections call into the runtime": (
        projections_on_the_runtime,
        "projections/memory.py",
        _CALLED.format("from toolledger.runtime.errors import call_label"),
        Import("toolledger.projections.memory", "toolledger.runtime.errors", "call_label", "call"),
    ),
    "projections load settings": (
        projections_on_the_runtime,
        "projections/projector.py",
        "\nfrom toolledger.settings import ConfigError\n",
        Import("toolledger.projections.projector", "toolledger.settings", "ConfigError", "load"),
    ),
    "leader runtime side names the projector side": (
        leader_runtime_side_on_the_projector,
        "leader/runtime_side/connection.py",
        _TYPING.format("from toolledger.leader.projector_side.reads import LeaderReads"),
        Import(
            "toolledger.leader.runtime_side.connection",
            "toolledger.leader.projector_side.reads",
            "LeaderReads",
            "typing",
        ),
    ),
    "leader runtime side calls into the wiring": (
        leader_runtime_side_on_the_projector,
        "leader/runtime_side/port.py",
        _CALLED.format("from toolledger.wiring.stack import LedgerStack"),
        Import(
            "toolledger.leader.runtime_side.port", "toolledger.wiring.stack", "LedgerStack", "call"
        ),
    ),
}


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package, as the guards see it (sources only)."""
    target = tmp_path_factory.mktemp("layers") / "toolledger"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


@pytest.mark.parametrize("case", sorted(FORBIDDEN))
def test_each_guard_names_a_forbidden_import_added_to_a_copy(copy: Path, case: str) -> None:
    """A guard that passes whatever the imports are guards nothing: on a copy of the package
    it must report nothing, and after one forbidden import is added, exactly that one."""
    guard, file, added, expected = FORBIDDEN[case]
    path = copy / file
    before = path.read_text()
    assert guard(Tree(copy)) == set()
    try:
        path.write_text(before + added)
        assert guard(Tree(copy)) == {expected}
    finally:
        path.write_text(before)


@pytest.mark.parametrize(
    ("file", "added"),
    [
        ("port.py", _CALLED.format("from toolledger.runtime.ledger import Ledger")),
        ("events/models.py", _TYPING.format("from toolledger.port import RuntimePort")),
    ],
    ids=["a call-time import", "an annotation's import"],
)
def test_the_circle_guard_counts_every_import(copy: Path, file: str, added: str) -> None:
    """A circle closed by an import inside a function, or under `if TYPE_CHECKING:`, is a
    circle: `toolledger.runtime.ledger` loads `toolledger.port`, which loads the events."""
    path = copy / file
    before = path.read_text()
    assert circles(Tree(copy)) == []
    try:
        path.write_text(before + added)
        found = circles(Tree(copy))
    finally:
        path.write_text(before)
    module = ".".join(["toolledger", *Path(file).with_suffix("").parts])
    assert len(found) == 1 and module in found[0], found
