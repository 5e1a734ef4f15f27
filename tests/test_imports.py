"""Every module imports on its own, first, in a fresh interpreter, with warnings as errors.

An import cycle hidden by the order in which a test session happens to
import modules shows up here as an ImportError (a partly initialised
module); a deprecation in an import path, as an error.
"""

from __future__ import annotations

import ast
import os
import pkgutil
import re
import subprocess
import sys

import pytest

import nanobucket

#: The compiled modules: absent, or not to be loaded, in a pure-Python run.
COMPILED = {"nanobucket._core._bucket_c", "nanobucket._core._shared_c", "nanobucket.bench._floor"}
MODULES = [
    "nanobucket",
    *sorted(
        m.name
        for m in pkgutil.walk_packages(nanobucket.__path__, "nanobucket.")
        if not (os.environ.get("NANOBUCKET_NO_EXTENSIONS") and m.name in COMPILED)
    ),
]
#: ``-I`` drops PYTHONPATH, so the directory that holds the package under test goes in by hand.
SRC = os.path.dirname(os.path.dirname(os.path.abspath(nanobucket.__file__)))


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports_first_and_alone(module: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-W",
            "error",
            "-c",
            f"import sys; sys.path.insert(0, {SRC!r}); import {module}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_module_is_listed() -> None:
    assert {
        "nanobucket.redis",
        "nanobucket.redis._sync",
        "nanobucket.bench.cases",
        "nanobucket.asgi",
        "nanobucket.waiting",
    } <= set(MODULES)


def _type_only(tree: ast.Module) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: imports that never run."""
    return {
        id(node)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) in _TYPE_CHECKING
        for child in stmt.body
        for node in ast.walk(child)
    }


_TYPE_CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")
#: ``from X import a, b`` and ``from X cimport a`` in a .pyx (the text, not docstrings' ``>>>``).
_PYX_IMPORT = re.compile(
    r"^[ \t]*from\s+(\.*)([\w.]*)\s+(c?)import\s+(\([^)]*\)|[\w, ]+)", re.MULTILINE
)


def _imports(path: str) -> list[tuple[int, str, list[str], bool]]:
    """``(level, module, names, cimport)`` for each import statement in *path*, at any depth."""
    found: list[tuple[int, str, list[str], bool]] = []
    if path.endswith(".pyx"):
        for name in [path, *_included(path)]:
            with open(name, encoding="utf-8") as f:
                for m in _PYX_IMPORT.finditer(f.read()):
                    written = m.group(4).strip("()")
                    names = [n.split()[0] for n in written.split(",") if n.strip()]
                    found.append((len(m.group(1)), m.group(2), names, bool(m.group(3))))
        return found
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and id(node) not in skip:
            found += [(0, alias.name, [], False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and id(node) not in skip:
            found.append((node.level, node.module or "", [a.name for a in node.names], False))
    return found


def _included(pyx: str) -> list[str]:
    """The .pxi files *pyx* includes: its text, as far as imports go."""
    with open(pyx, encoding="utf-8") as f:
        names = re.findall(r'^include "([\w.]+)"', f.read(), re.MULTILINE)
    return [os.path.join(os.path.dirname(pyx), name) for name in names]


def _import_graph() -> dict[str, set[str]]:
    """Each module of the package to the package's modules it imports when it runs.

    ``from . import waiting`` imports the module ``waiting``, not the
    package's ``__init__`` (already running); ``from nanobucket cimport
    _gcra`` reads a .pxd at build time and imports nothing.
    """
    root = os.path.dirname(os.path.abspath(nanobucket.__file__))
    files: dict[str, str] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            stem, ext = os.path.splitext(name)
            if ext in (".py", ".pyx"):
                rel = os.path.relpath(os.path.join(folder, stem), os.path.dirname(root))
                files[os.path.join(folder, name)] = rel.replace(os.sep, ".").removesuffix(
                    ".__init__"
                )
    modules = set(files.values())
    packages = {module for path, module in files.items() if path.endswith("__init__.py")}
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for path, module in files.items():
        package = module if module in packages else module.rpartition(".")[0]
        for level, written, names, cimport in _imports(path):
            name = written
            if level:
                parts = package.split(".")
                name = ".".join([*parts[: len(parts) - level + 1], *([written] if written else [])])
            submodules = {f"{name}.{n}" for n in names} & modules
            graph[module] |= submodules
            from_itself = len(submodules) < len(names) or not names  # names defined in *name*
            if name in modules and from_itself and not (cimport and name in packages):
                graph[module].add(name)
        graph[module].discard(module)
    return graph


def test_no_import_cycle_among_the_packages_own_modules() -> None:
    # Every import counts, also one inside a function: an import moved into
    # a function to dodge a cycle still makes one, only later.
    graph = _import_graph()
    assert {"nanobucket._core._bucket_c", "nanobucket.waiting"} <= set(graph)
    assert "nanobucket._core._params" in graph["nanobucket._core._bucket_c"]  # a .pyx is read, too
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
