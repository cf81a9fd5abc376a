"""The package's modules import each other in one direction: no circle, TYPE_CHECKING imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fairring"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The fairring modules `path` imports, wherever in the file (functions and TYPE_CHECKING too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c.startswith("fairring") and c != name)
    return found


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (module -> modules it imports), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def package_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    # A package's __init__ importing its own submodules is not a circle with them.
    return {
        name: {m for m in imports_of(path) if m in modules and not name.startswith(m + ".") and m != name}
        for name, path in modules.items()
    }


def test_no_import_circle() -> None:
    assert cycle_in(package_graph()) is None, f"an import circle: {' -> '.join(cycle_in(package_graph()) or [])}"


def test_a_circle_is_found() -> None:
    """Negative control: the check finds a circle through TYPE_CHECKING imports too."""
    graph = package_graph()
    graph["fairring._interfaces"] = graph["fairring._interfaces"] | {"fairring._config"}
    assert cycle_in(graph) is not None
    assert imports_of(PACKAGE / "_config.py") >= {"fairring._interfaces", "fairring._sizes"}
