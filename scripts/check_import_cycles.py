#!/usr/bin/env python3
"""check_import_cycles: fail when the modules of app/ and widgets/ import each other in a circle.

    python3 scripts/check_import_cycles.py [ROOT [PACKAGE ...]]

Reads every module of the packages (default: app and widgets under the repository root) with `ast`, without
importing anything. An import counts wherever it is written: at module level, inside a function, and under
`if TYPE_CHECKING:` (it never runs, but the two files still lean on each other: what both need belongs in the
lower one or a module of its own; docs/architecture.md#what-may-import-what-and-how-it-is-checked).
`from pkg import name` is an import of the module `pkg.name` when there is one, else of `pkg`; relative imports
are resolved; imports of other packages are left out.
Exits 1 and prints one shortest cycle through each module that is on one (`a -> b -> a`), 0 with a
one-line summary when there is none. A cycle in KNOWN_CYCLES is printed as known (to stderr) and passes; one
that is gone is said, so its entry can be deleted.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PACKAGES = ("app", "widgets")

ImportGraph = dict[str, set[str]]

KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()
"""Cycles that pass for now, each as the set of its modules. Add none: break the cycle instead."""


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name (a package's `__init__.py` is the package)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`: module level, in functions and classes, under `if TYPE_CHECKING:`."""
    for child in ast.walk(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child


def _known(name: str, modules: set[str]) -> str | None:
    """`name` or its nearest enclosing module that is one of ours; None for another package's module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ours that `module` imports (at run time or for its types)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for statement in _imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        else:
            base = statement.module or ""
            if statement.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (statement.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in statement.names]
        for name in names:
            target = _known(name, modules)
            if target is not None and target != module:
                targets.add(target)
    return targets


def build_graph(root: Path, packages: Iterable[str]) -> ImportGraph:
    """Module -> the modules of ours it imports, for every module of `packages` under `root`."""
    files = module_files(root, packages)
    names = set(files)
    return {module: imports_of(module, path, names) for module, path in files.items()}


def _shortest_cycle_through(start: str, graph: ImportGraph) -> list[str] | None:
    """The shortest path start -> ... -> start (breadth first), or None when start is on no cycle."""
    reached_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        for target in sorted(graph.get(current, ())):
            if target == start:
                path = [current]
                while path[-1] != start:
                    path.append(reached_from[path[-1]])
                return [*reversed(path), start]
            if target not in reached_from:
                reached_from[target] = current
                queue.append(target)
    return None


def find_cycles(graph: ImportGraph) -> list[list[str]]:
    """One shortest cycle through each module that is on a cycle, each written once (from its first module)."""
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for module in sorted(graph):
        cycle = _shortest_cycle_through(module, graph)
        if cycle is None:
            continue
        ring = cycle[:-1]
        first = ring.index(min(ring))
        rotated = (*ring[first:], *ring[:first])
        if rotated not in seen:
            seen.add(rotated)
            cycles.append([*rotated, rotated[0]])
    return cycles


def main(argv: Sequence[str] | None = None, known: frozenset[frozenset[str]] = KNOWN_CYCLES) -> int:
    """Print the cycles and return 1, or print a summary and return 0; cycles in `known` are said and pass."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else REPO
    packages = args[1:] or list(DEFAULT_PACKAGES)
    graph = build_graph(root, packages)
    cycles = find_cycles(graph)
    new = [cycle for cycle in cycles if frozenset(cycle) not in known]
    found = {frozenset(cycle) for cycle in cycles}
    for cycle in cycles:
        if cycle not in new:
            print(f"known import cycle, passes for now (KNOWN_CYCLES): {' -> '.join(cycle)}", file=sys.stderr)
    checked = set(module_files(root, packages))
    for gone in sorted(sorted(entry) for entry in known if entry <= checked and entry not in found):
        print(f"known import cycle is gone, delete its KNOWN_CYCLES entry: {', '.join(gone)}", file=sys.stderr)
    for cycle in new:
        print(" -> ".join(cycle))
    if new:
        print(f"{len(new)} import cycle(s) in {', '.join(packages)}", file=sys.stderr)
        return 1
    edges = sum(len(targets) for targets in graph.values())
    but = f" but {len(cycles)} known" if cycles else ""
    print(f"no import cycles{but}: {len(graph)} modules, {edges} imports between them ({', '.join(packages)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
