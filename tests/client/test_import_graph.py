"""Dependencies inside ``kcoral`` point one way: no import circle, nothing upward.

Every ``import`` statement of a ``kcoral`` module counts, at module level or inside a
function, except those under ``if TYPE_CHECKING:`` (annotations only). "Upward" means the
client importing the server (``kcoral_server``) or the notebook layer (``kcoral_jupyter``)
when it is imported; ``kcoral.protocol`` must not depend on the rest of ``kcoral`` at all.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kcoral"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(path: Path, *, module_level_only: bool = False) -> set[str]:
    """Absolute names of what ``path`` imports (``from a import b`` gives ``a`` and
    ``a.b``, so a sub-module import is seen whichever form it takes)."""
    tree = ast.parse(path.read_text(), str(path))
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    names: set[str] = set()

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other, nested)
                continue
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if module_level_only and inner:
                continue
            if isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child, inner)

    visit(tree, False)
    return names


def graph() -> dict[str, set[str]]:
    """kcoral module -> the kcoral modules it imports (a package counts as its __init__)."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {n for n in imported_names(path) if n in MODULES and n != name}
        edges[name] = targets - {"kcoral"} if name != "kcoral" else targets
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = walk(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = walk(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_circle_and_accepts_a_tree() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_of_kcoral_imports_itself_back_in_a_circle() -> None:
    # ``kcoral`` itself (the package) only names its exports lazily; a module reading
    # ``kcoral.__version__`` is not a circle, so edges into the package are left out.
    assert find_cycle(graph()) is None


def test_the_protocol_layer_depends_on_nothing_else_in_kcoral() -> None:
    for name, path in MODULES.items():
        if name.startswith("kcoral.protocol"):
            outside = {
                n
                for n in imported_names(path)
                if n.split(".")[0] == "kcoral" and not n.startswith("kcoral.protocol")
            }
            assert outside == set(), f"{name} imports {sorted(outside)}"


@pytest.mark.parametrize("layer", ["kcoral_server", "kcoral_jupyter"])
def test_no_kcoral_module_imports_the_server_or_the_notebook_layer_when_imported(
    layer: str,
) -> None:
    for name, path in MODULES.items():
        upward = {
            n for n in imported_names(path, module_level_only=True) if n.split(".")[0] == layer
        }
        assert upward == set(), f"{name} imports {sorted(upward)} at import time"


def test_importing_every_client_module_loads_neither_the_server_nor_the_notebook_layer() -> None:
    client_modules = sorted(name for name in MODULES if name != "kcoral.__main__")  # runs
    code = (
        "import importlib, sys\n"
        f"for name in {client_modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kcoral_server', 'kcoral_jupyter', 'tornado', 'IPython')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"
