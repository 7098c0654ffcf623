"""The three package trees keep the layout rules of issue 30: a folder per idea, so that a
newcomer goes from an import path to its file and from a file to its one idea.

The trees are ``kcoral/``, ``server/kcoral_server/`` and ``jupyter_ext/kcoral_jupyter/``.
The rules, and how this file reads them:

* **A folder per idea, no prefix families.** A module's prefix is its name up to the first
  ``_`` (leading underscores dropped, so ``_pool_x`` has prefix ``pool``); a name without
  ``_`` is its own prefix, so ``pool.py`` belongs to the family of ``pool_x.py``. A
  sub-package counts like a module (``worker/`` beside ``worker_*.py`` is one family).
  ``__init__`` and ``__main__`` belong to no family. At most 3 members share a prefix.
* **A folder stays readable**: at most 20 modules (``.py`` files other than ``__init__`` and
  ``__main__``; sub-packages are folders of their own and are checked by themselves).
* **Every name is imported from the module that defines it.** For each ``from X import N``
  (at any depth, ``TYPE_CHECKING`` blocks included) in the package trees and in ``tests/``,
  ``benchmarks/`` and ``examples/``, where X is a module of the package trees and N is not
  a sub-module of X, X must *define* N: bind it at module level by ``def``, ``class``,
  assignment, annotated or augmented assignment, ``for``/``with`` target, or a ``global``
  statement in one of its functions. A name X binds only by importing it is not defined
  there, even inside ``try``/``except ImportError`` (each branch names where it comes
  from); a name X binds both by an import and by an assignment (``except ImportError:
  name = None``) is defined in X, because X owns the choice. The exception is a package
  ``__init__`` that hands on a public API, listed in ``REEXPORTING_MODULES``. (A module
  may still re-export documented names for users and uploaded code, as ``kcoral.errors``
  does for ``ExecutionError``, PROTOCOL §7.6; our own code and tests import them from where
  they are defined.) The tests' helper modules (``http_helpers``, ``e2e_support``, ...) are
  no X here: they gather what tests share.
* **Small classes and modules**: no class over 300 lines (from its ``class`` line to its
  last line), no module over 600 lines, except the declarative settings modules listed in
  ``DECLARATIVE_SETTINGS`` (one declaration per setting, so they grow with the settings).
"""

from __future__ import annotations

import ast
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS: dict[str, Path] = {
    "kcoral": ROOT / "kcoral",
    "kcoral_server": ROOT / "server" / "kcoral_server",
    "kcoral_jupyter": ROOT / "jupyter_ext" / "kcoral_jupyter",
}
OTHER_IMPORTERS = (ROOT / "tests", ROOT / "benchmarks", ROOT / "examples")

MAX_FAMILY_SIZE = 3
MAX_MODULES_PER_FOLDER = 20
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 600
NOT_IN_FAMILIES = {"__init__", "__main__"}

# Package `__init__`s that hand on names they import, and why.
REEXPORTING_MODULES: dict[str, str] = {
    "kcoral": "the public client API of CLIENT_API §1, resolved lazily through `_EXPORTS`",
    "kcoral_jupyter": "the IPython extension and Jupyter server extension hooks",
    "kcoral.remote": "load_requested, dump_by_value and the pickle envelope, which kcoral_jupyter "
    "and older %%kcoral code import from kcoral.remote (before it was a package)",
}

# Declarative settings: one `setting(...)` declaration per option (flag, kind, default, help).
DECLARATIVE_SETTINGS = {
    "server/kcoral_server/settings/config.py",
    "server/kcoral_server/settings/command_line.py",
    "server/kcoral_server/router/settings.py",
}


# Classes (`path:Class`) and modules (`path`) over the limits today, being split (issue 30
# point 5). Remove an entry once it fits; the list ends empty.
@dataclass(frozen=True)
class Module:
    """One module of the package trees: its dotted name and file."""

    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def package(self) -> str:
        """The package its relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def python_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" not in path.parts and "node_modules" not in path.parts:
            yield path


@cache
def package_modules() -> dict[str, Module]:
    """Every module of the three package trees by dotted name (a package by its own name)."""
    modules: dict[str, Module] = {}
    for top, folder in PACKAGE_ROOTS.items():
        for path in python_files(folder):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = Module(".".join(parts), path)
    return modules


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def package_folders() -> list[Path]:
    return sorted({module.path.parent for module in package_modules().values()})


def module_stems(folder: Path) -> list[str]:
    return sorted(path.stem for path in folder.glob("*.py"))


def subpackages(folder: Path) -> list[str]:
    return sorted(path.parent.name for path in folder.glob("*/__init__.py"))


def prefix(name: str) -> str:
    return name.lstrip("_").split("_")[0]


# ---------------------------------------------------------------------------------------------
# a, b: folders


def test_no_folder_holds_four_modules_sharing_a_name_prefix() -> None:
    problems: list[str] = []
    for folder in package_folders():
        families: dict[str, list[str]] = defaultdict(list)
        for stem in module_stems(folder):
            if stem not in NOT_IN_FAMILIES:
                families[prefix(stem)].append(f"{stem}.py")
        for name in subpackages(folder):
            families[prefix(name)].append(f"{name}/")
        problems += [
            f"{shown(folder)}/ holds {len(members)} modules with prefix {family!r} "
            f"({', '.join(sorted(members))}): give the family a folder"
            for family, members in sorted(families.items())
            if len(members) > MAX_FAMILY_SIZE
        ]
    assert not problems, "\n".join(problems)


def test_no_folder_holds_more_than_twenty_modules() -> None:
    problems: list[str] = []
    for folder in package_folders():
        stems = [stem for stem in module_stems(folder) if stem not in NOT_IN_FAMILIES]
        if len(stems) > MAX_MODULES_PER_FOLDER:
            problems.append(
                f"{shown(folder)}/ holds {len(stems)} modules (at most "
                f"{MAX_MODULES_PER_FOLDER}): group them into folders by idea"
            )
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# c: every name from the module that defines it


def target_names(target: ast.expr) -> Iterator[str]:
    """The names an assignment target binds (`a`, `a, (b, *c)`; not `a.b` or `a[0]`)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Starred):
        yield from target_names(target.value)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from target_names(element)


def nested_statements(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists inside a compound statement (`if`, `try`, `with`, loops, `match`,
    and also `def` and `class`)."""
    for field in ("body", "orelse", "finalbody"):
        inner = getattr(statement, field, None)
        if isinstance(inner, list):
            yield inner
    for handler in getattr(statement, "handlers", []):
        yield handler.body
    for case in getattr(statement, "cases", []):
        yield case.body


def module_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run at module level: into `if`, `try`, `with`, loops; not into
    functions and classes."""
    for statement in body:
        yield statement
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for inner in nested_statements(statement):
                yield from module_level_statements(inner)


def all_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, at any depth (walking statements only: expressions hold none)."""
    for statement in body:
        yield statement
        for inner in nested_statements(statement):
            yield from all_statements(inner)


@cache
def definitions(path: Path) -> frozenset[str]:
    """The names a module binds at module level by anything but an import."""
    tree = parsed(path)
    defined: set[str] = set()
    for statement in module_level_statements(tree.body):
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(statement.name)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                defined.update(target_names(target))
        elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
            defined.update(target_names(statement.target))
        elif isinstance(statement, (ast.For, ast.AsyncFor)):
            defined.update(target_names(statement.target))
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            for item in statement.items:
                if item.optional_vars is not None:
                    defined.update(target_names(item.optional_vars))
        elif type(statement).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12)
            defined.update(target_names(statement.name))  # type: ignore[attr-defined]
    for node in all_statements(tree.body):
        if isinstance(node, ast.Global):
            defined.update(node.names)
    return frozenset(defined)


@cache
def imported_from(path: Path, package: str | None) -> dict[str, str]:
    """The names a module binds at module level by `from X import N`, and their X."""
    sources: dict[str, str] = {}
    for statement in module_level_statements(parsed(path).body):
        if isinstance(statement, ast.ImportFrom):
            source = imported_module(statement, package)
            for alias in statement.names:
                if source is not None:
                    sources[alias.asname or alias.name] = f"{source}.{alias.name}"
    return sources


def imported_module(node: ast.ImportFrom, package: str | None) -> str | None:
    """The absolute name of X in `from X import ...` (None: relative outside a package)."""
    if not node.level:
        return node.module
    if package is None:
        return None
    parts = package.split(".")
    if node.level - 1 > len(parts) - 1:
        return None
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def defining_module(module: str, name: str) -> str | None:
    """Where `name`, as `module` has it, is defined: follows `from X import` chains (a
    sub-module imported into `module` comes from its package; None: nowhere found)."""
    modules = package_modules()
    seen: set[str] = set()
    while module in modules and module not in seen:
        seen.add(module)
        here = modules[module]
        if name in definitions(here.path):
            return module
        source = imported_from(here.path, here.package).get(name)
        if source is None:
            return None
        module, _, name = source.rpartition(".")
        if source in modules:
            return module
    return module if module not in modules else None


def importing_files() -> list[tuple[Path, str | None]]:
    """Every file that imports, with the package its relative imports start from."""
    files: list[tuple[Path, str | None]] = [
        (module.path, module.package) for module in package_modules().values()
    ]
    for folder in OTHER_IMPORTERS:
        files += [(path, None) for path in python_files(folder)]
    return files


def misdirected_imports(path: Path, package: str | None) -> Iterator[str]:
    modules = package_modules()
    for node in all_statements(parsed(path).body):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = imported_module(node, package)
        if source not in modules or source in REEXPORTING_MODULES:
            continue
        for alias in node.names:
            where = f"{shown(path)}:{node.lineno}"
            if alias.name == "*":
                yield f"{where}: `from {source} import *` hides where its names come from"
            elif f"{source}.{alias.name}" in modules:
                continue  # a sub-module
            elif alias.name not in definitions(modules[source].path):
                origin = defining_module(source, alias.name)
                yield (
                    f"{where}: imports {alias.name} from {source}, which only imports it: "
                    f"import it from {origin}"
                    if origin
                    else f"{where}: imports {alias.name} from {source}, which does not define it"
                )


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    problems = [
        problem
        for path, package in importing_files()
        for problem in misdirected_imports(path, package)
    ]
    assert not problems, f"{len(problems)} misdirected imports:\n" + "\n".join(problems)


def test_the_reexporting_modules_are_package_inits_of_the_trees() -> None:
    modules = package_modules()
    for name in REEXPORTING_MODULES:
        assert name in modules and modules[name].is_package, (
            f"REEXPORTING_MODULES lists {name}, which is not a package of the trees"
        )


# ---------------------------------------------------------------------------------------------
# d: class and module sizes


def oversized() -> dict[str, str]:
    """Every class and module over its limit, outside the declarative settings: name ->
    what is wrong."""
    found: dict[str, str] = {}
    for module in package_modules().values():
        where = shown(module.path)
        if where in DECLARATIVE_SETTINGS:
            continue
        lines = len(module.path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            found[where] = f"module {where} is {lines} lines (at most {MAX_MODULE_LINES})"
        for node in all_statements(parsed(module.path).body):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    found[f"{where}:{node.name}"] = (
                        f"class {node.name} in {where} is {length} lines "
                        f"(at most {MAX_CLASS_LINES})"
                    )
    return found


def test_no_class_is_over_300_lines_and_no_module_over_600() -> None:
    problems = [f"{problem}: split it" for name, problem in sorted(oversized().items())]
    assert not problems, "\n".join(problems)


def test_the_declarative_settings_modules_exist() -> None:
    missing = sorted(name for name in DECLARATIVE_SETTINGS if not (ROOT / name).is_file())
    assert not missing, "DECLARATIVE_SETTINGS names missing files: " + ", ".join(missing)


#: the repository's top level, fixed (the developers' guide): anything else belongs in one
#: of these folders (notes in docs/)
TOP_LEVEL = {
    ".ci", ".dockerignore", ".gitignore", "README.md", "benchmarks", "deploy", "docs",
    "examples", "jupyter_ext", "kcoral", "labextension", "notebooks", "pyproject.toml",
    "server", "tests",
}  # fmt: skip


def test_the_repository_root_holds_only_the_fixed_layout() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if tracked.returncode != 0:
        pytest.skip(f"not a git checkout here: {tracked.stderr.strip()[:200]}")
    top = {line.split("/", 1)[0] for line in tracked.stdout.splitlines() if line}
    stray = sorted(top - TOP_LEVEL)
    assert not stray, f"files outside the fixed top-level layout: {stray} (move them)"
