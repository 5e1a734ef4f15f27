"""The package's layout: which folder may import which, no circle, and a short top level.

The direction is faces -> ``_http`` / ``_outbound`` -> ``_compose`` -> ``_core``: a private
folder imports only its own modules and those of the folders below it, and each folder's
docstring says so. Read from the installed package's files (a wheel's too), every import
counted, the lazy ones and those for the type checker included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import nanobucket

ROOT = Path(nanobucket.__file__).parent
# The folders below the faces, and the folders each may import besides itself.
BELOW = {
    "_core": set(),
    "_compose": {"_core"},
    "_http": {"_core", "_compose"},
    "_outbound": {"_core", "_compose"},
}
SOURCES = (".py", ".pyx", ".pxi", ".pxd")
# A Cython file's imports and cimports: "from X (c)import a, b" and "(c)import X".
CYTHON_FROM = re.compile(r"^[ \t]*from[ \t]+(\S+)[ \t]+c?import[ \t]+(\([^)]*\)|.+)", re.MULTILINE)
CYTHON_IMPORT = re.compile(r"^[ \t]*c?import[ \t]+([\w.]+)", re.MULTILINE)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(path: Path) -> str:
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def resolve(path: Path, level: int, module: str | None) -> str:
    base = package_of(path).split(".")
    if level > 1:
        base = base[: -(level - 1)]
    return ".".join([*base, module] if module else base)


def known(name: str) -> str | None:
    """The package module *name* is, or is in (``nanobucket._core._params.X`` -> its module)."""
    while name.startswith("nanobucket"):
        if name in MODULES:
            return name
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return None


def files() -> list[Path]:
    return sorted(
        p for p in ROOT.rglob("*") if p.suffix in SOURCES and "__pycache__" not in p.parts
    )


MODULES = {module_name(p) for p in files() if p.suffix in (".py", ".pyx", ".pxd")}


def imports(path: Path) -> tuple[set[str], set[str]]:
    """The package modules *path* imports: (all of them, those imported when it is)."""
    every: set[str] = set()
    eager: set[str] = set()
    if path.suffix != ".py":
        text = path.read_text()
        base = "nanobucket._core" if path.suffix == ".pxi" else package_of(path)
        here = ROOT.parent / base.replace(".", "/") / "x.pyx"
        for module, text_of_names in CYTHON_FROM.findall(text):
            level = len(module) - len(module.lstrip("."))
            target = resolve(here, level, module.lstrip(".") or None) if level else module
            listed = text_of_names.strip("()").split(",")
            names = [f"{target}.{n.split()[0]}" for n in listed if n.strip()]
            for name in names if all(n in MODULES for n in names) else [target, *names]:
                if found := known(name):
                    every.add(found)
        every |= {found for m in CYTHON_IMPORT.findall(text) if (found := known(m))}
        return every, set(every)
    tree = ast.parse(path.read_text())
    at_import = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = resolve(path, node.level, node.module) if node.level else node.module or ""
            # "from package import submodule" imports the submodule; the package is
            # imported for the names that are not modules of it.
            names = [f"{target}.{a.name}" for a in node.names]
            if not all(n in MODULES for n in names):
                names.append(target)
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        modules = {m for n in names if (m := known(n))}
        every |= modules
        if id(node) in at_import:
            eager |= modules
    return every, eager


def folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in BELOW else None


GRAPH = {module_name(p): imports(p) for p in files() if p.suffix in (".py", ".pyx")}


def test_the_private_folders_import_only_downwards() -> None:
    wrong = []
    for path in files():
        own = folder(module_name(path)) if path.suffix != ".pxi" else "_core"
        if own is None:
            continue
        for target in imports(path)[0]:
            if folder(target) not in {own} | BELOW[own]:
                wrong.append(f"{module_name(path)} imports {target}")
    assert wrong == []


def test_no_module_imports_itself_back() -> None:
    """No circle among the imports a module runs when it is imported."""
    eager = {m: {t for t in deps[1] if t != m} for m, deps in GRAPH.items()}
    state: dict[str, int] = {}
    circles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(eager.get(module, ())):
            if state.get(target) == 1:
                circles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = 2

    for module in sorted(eager):
        if module not in state:
            visit(module, [module])
    assert circles == []


@pytest.mark.parametrize("name", sorted(BELOW))
def test_each_folder_says_what_it_holds_and_may_import(name: str) -> None:
    doc = ast.get_docstring(ast.parse((ROOT / name / "__init__.py").read_text())) or ""
    assert "What it holds" in doc
    assert "may import" in doc
    allowed = re.search(r"What it may import: (.*?)(\n\n|$)", doc, re.DOTALL)
    assert allowed is not None
    named = set(re.findall(r"nanobucket\.(_\w+)", allowed.group(1)))
    assert named == BELOW[name]


def test_the_top_holds_the_public_faces_only() -> None:
    top = sorted(p.name for p in ROOT.iterdir() if p.is_file() and p.suffix in (*SOURCES, ".typed"))
    assert len(top) <= 30, top
    # Private code lives in the folders: the top has no private module but the entry point.
    assert [n for n in top if n.startswith("_") and n not in ("__init__.py", "__main__.py")] == []
