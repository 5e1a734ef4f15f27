"""The examples in the docstrings run as written (DESIGN: a two-line example per public name).

Every public name (a module's ``__all__``) and every public method of a
public class has an example that runs (in the core, both implementations,
every attribute too), and the API reference (``docs/reference/index.md``) names
every public name.
"""

from __future__ import annotations

import asyncio
import doctest
import importlib
import importlib.util
import inspect
import os
import re
import tempfile
from pathlib import Path
from types import MemberDescriptorType, ModuleType

import pytest

#: The Redis package's modules: their examples share one set-up (`_redis_globals`).
REDIS_MODULES = [
    "nanobucket.redis",
    "nanobucket.redis._breaker",
    "nanobucket.redis._policy",
    "nanobucket.redis._bounded",
    "nanobucket.redis._clients",
    "nanobucket.redis._limits",
    "nanobucket.redis._sync",
    "nanobucket.redis._async",
    "nanobucket.redis._lease",
]
#: The modules whose examples make files: each docstring's examples get ``tmp_dir``, a
#: fresh scratch directory removed after them, and ``os`` (see `nanobucket.shared`).
SCRATCH_MODULES = ["nanobucket.shared", "nanobucket._core._shared_c", "nanobucket.simulate"]
MODULES = [
    "nanobucket",
    "nanobucket.reference",
    "nanobucket.decorator",
    "nanobucket.layered",
    "nanobucket.one_key",
    "nanobucket.concurrency",
    "nanobucket.tiered",
    "nanobucket.penalty",
    "nanobucket.waiting",
    "nanobucket.explain",
    "nanobucket.simulate",
    "nanobucket.size",
    "nanobucket._http",
    "nanobucket._http.views",
    "nanobucket._http.address",
    "nanobucket._http.keys",
    "nanobucket._http.routes",
    "nanobucket._http.policy",
    "nanobucket._http.counters",
    "nanobucket._http.answer",
    "nanobucket._http.gate",
    "nanobucket._http.clients",
    "nanobucket._http.websocket",
    "nanobucket.asgi",
    "nanobucket.wsgi",
    "nanobucket.fastapi",
    "nanobucket.aiohttp",
    "nanobucket.django",
    "nanobucket._http.drf",
    *REDIS_MODULES,
    "nanobucket.hooks",
    "nanobucket.metrics",
    "nanobucket._outbound.pacer",
    "nanobucket._outbound.adapter",
    "nanobucket._outbound.shared",
    "nanobucket._outbound.fields",
    "nanobucket._outbound.learn",
    "nanobucket._outbound.budgets",
    "nanobucket._outbound.budget_fields",
    "nanobucket._compose.drive",
    "nanobucket._compose.verbs",
    "nanobucket._core._limiter",
    "nanobucket.httpx",
    "nanobucket.requests",
    "nanobucket.executor",
    "nanobucket.pacing",
    "nanobucket.celery",
    "nanobucket.testing",
    "nanobucket._compose.switch",
    "nanobucket._core._acquire",
]

# The public modules whose names (and the methods of their classes) must
# carry an example; the core's classes are checked in the modules that define
# them (CORE), for both implementations, so only their class docstrings here.
PUBLIC = [
    "nanobucket",
    "nanobucket.layered",
    "nanobucket.concurrency",
    "nanobucket.tiered",
    "nanobucket.penalty",
    "nanobucket.decorator",
    "nanobucket.waiting",
    "nanobucket.redis",
    "nanobucket.asgi",
    "nanobucket.wsgi",
    "nanobucket.fastapi",
    "nanobucket.aiohttp",
    "nanobucket.django",
    "nanobucket.shared",
    "nanobucket.reference",
    "nanobucket.explain",
    "nanobucket.simulate",
    "nanobucket.size",
    "nanobucket.hooks",
    "nanobucket.metrics",
    "nanobucket.httpx",
    "nanobucket.requests",
    "nanobucket.executor",
    "nanobucket.pacing",
    "nanobucket.celery",
    "nanobucket.testing",
]
CORE = (
    "nanobucket._core._bucket_c",
    "nanobucket._core._bucket_py",
    "nanobucket._core._decision_py",
    "nanobucket._core._shared_c",
)
# The modules whose examples `_examples_of` collects (doctest.testmod misses some).
COLLECTED = [
    pytest.param("nanobucket._core._bucket_py", id="_bucket_py"),
    pytest.param("nanobucket._core._decision_py", id="_decision_py"),
    pytest.param("nanobucket._core._bucket_c", marks=pytest.mark.c_extension, id="_bucket_c"),
    pytest.param("nanobucket._core._shared_c", marks=pytest.mark.c_extension, id="_shared_c"),
    pytest.param("nanobucket.bench._floor", marks=pytest.mark.c_extension, id="_floor"),
]

API_REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "index.md"


def _redis_globals() -> dict[str, object]:
    """What the Redis examples take as given (the package docstring says so): the
    package's names, redis-py, asyncio, KeyedTokenBucket, and ``down``, a breaker
    Redis has just failed (no example then reaches the network)."""
    import redis
    import redis.asyncio

    import nanobucket
    import nanobucket.redis as nbr

    down = nbr.CircuitBreaker(clock=lambda: 0)
    down.record_failure()
    names = {name: getattr(nbr, name) for name in (*nbr.__all__, "failure_reason")}
    return {
        **names,
        "redis": redis,
        "asyncio": asyncio,
        "KeyedTokenBucket": nanobucket.KeyedTokenBucket,
        "down": down,
    }


def _example_plan() -> object:
    """An asyncio Redis plan whose Redis has just failed (`AsyncTiered`'s examples run offline)."""
    import redis.asyncio

    from nanobucket.redis import AsyncRedisTokenBucket, CircuitBreaker

    down = CircuitBreaker(clock=lambda: 0)
    down.record_failure()
    return AsyncRedisTokenBucket(redis.asyncio.Redis(), 10, 20, on_error="open", breaker=down)


def _doctest(module: ModuleType, face: ModuleType | None = None) -> doctest.TestResults:
    """*module*'s examples; those of code a *face* re-exports see the face's names too."""
    if module.__name__ in SCRATCH_MODULES:
        return _run(doctest.DocTestFinder().find(module), scratch=True)
    extra: dict[str, object] = dict(vars(face)) if face is not None else {}
    # The asyncio verbs are shown on an asyncio Redis limiter.
    if module.__name__ in (*REDIS_MODULES, "nanobucket._compose.verbs"):
        extra.update(_redis_globals())
    if module.__name__ in ("nanobucket.tiered", "nanobucket._compose.tiered"):
        extra["example_plan"] = _example_plan
    return doctest.testmod(module, optionflags=doctest.ELLIPSIS, extraglobs=extra or None)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = _doctest(module)
    written = name.replace("nanobucket.", "nanobucket._compose.", 1)
    if name.count(".") == 1 and importlib.util.find_spec(written) is not None:
        # A face: the examples of the code it re-exports too.
        other = _doctest(importlib.import_module(written), face=module)
        result = doctest.TestResults(
            result.failed + other.failed, result.attempted + other.attempted
        )
    assert result.attempted > 0
    assert result.failed == 0


def _examples_of(module: ModuleType) -> list[doctest.DocTest]:
    """The docstring examples of *module*, read from its classes' ``__dict__``.

    Not doctest.testmod: it skips the docstring of a slot (the pure-Python
    Decision's fields) and, on the extensions, of every attribute and
    property of a cdef class (getset descriptors, not `property`); and
    Cython's ``__test__`` dict (autotestdict) repeats the methods' examples
    it finds. So: the module's docstring, then each function and class it
    defines, then every member of each class, each example once.
    """
    parser = doctest.DocTestParser()
    tests: list[doctest.DocTest] = []

    def add(name: str, doc: object) -> None:
        if isinstance(doc, str) and parser.get_examples(doc):
            path = getattr(module, "__file__", None)
            # The twin's Decision is shown on the twin's buckets.
            globs = dict(vars(module))
            if module.__name__ == "nanobucket._core._decision_py":
                globs = {**vars(importlib.import_module("nanobucket._core._bucket_py")), **globs}
            tests.append(parser.get_doctest(doc, globs, name, path, None))

    add(module.__name__, module.__doc__)
    for name, obj in vars(module).items():
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        add(f"{module.__name__}.{name}", obj.__doc__)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if _is_member(member):
                    add(f"{module.__name__}.{name}.{attr}", _own_doc(member))
    return tests


def _run(tests: list[doctest.DocTest], scratch: bool = False) -> doctest.TestResults:
    """Run *tests*; with *scratch*, each docstring's in a fresh ``tmp_dir`` (`SCRATCH_MODULES`)."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        if not scratch:
            runner.run(test)
            continue
        with tempfile.TemporaryDirectory(prefix="nanobucket-example-") as tmp_dir:
            test.globs.update(os=os, tmp_dir=tmp_dir)
            runner.run(test)
    return runner.summarize(verbose=False)


def _own_doc(member: object) -> str | None:
    """*member*'s docstring, not one inherited (as inspect.getdoc would find)."""
    member = _unwrap(member)
    if isinstance(member, MemberDescriptorType):
        return inspect.getdoc(member)  # a slot's: the value in a __slots__ dict
    doc = getattr(member, "__doc__", None)
    return doc if isinstance(doc, str) else None


def _unwrap(member: object) -> object:
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__  # the function carries the docstring
    return member


def _is_member(member: object) -> bool:
    """A method, property or attribute (a slot, a cdef attribute) of a class."""
    member = _unwrap(member)
    return inspect.isroutine(member) or inspect.isdatadescriptor(member)


@pytest.mark.parametrize("name", COLLECTED)
def test_docstring_examples_of_the_core_and_the_extensions(name: str) -> None:
    module = pytest.importorskip(name)
    tests = _examples_of(module)
    result = _run(tests, scratch=name in SCRATCH_MODULES)
    assert (result.attempted, result.failed) == (sum(len(t.examples) for t in tests), 0)
    if name in CORE:  # every member's example was attempted, not just found
        assert {n for n, _ in _core_members(module)} <= {t.name for t in tests}


@pytest.mark.c_extension
def test_docstring_examples_of_shared_memory() -> None:
    # The tables need the _shared_c extension (not built on Windows, nor on a
    # pure-Python install): there the examples cannot run.
    pytest.importorskip("nanobucket._core._shared_c")
    result = _doctest(importlib.import_module("nanobucket.shared"))
    assert (result.attempted > 0, result.failed) == (True, 0)


def _public_names(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    # No __all__ (reference.py): what the module itself defines.
    return [
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    ]


def _runs_an_example(obj: object) -> bool:
    doc = _own_doc(obj) or ""
    examples = doctest.DocTestParser().get_examples(doc)
    return any(not e.options.get(doctest.SKIP, False) for e in examples)


def _members(cls: type) -> list[tuple[str, object]]:
    """Public methods and properties of *cls*, and of its private bases in the package.

    (The Redis limiters share a private base; a public base is checked under
    its own name, and the core's classes where they are defined: see
    `_core_members`.)
    """
    found: list[tuple[str, object]] = []
    for base in cls.__mro__:
        if not base.__module__.startswith("nanobucket.") or base.__module__ in CORE:
            continue
        if base is not cls and not base.__name__.startswith("_"):
            continue
        for attr, value in vars(base).items():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__  # noqa: PLW2901 - the function carries the docstring
            if not attr.startswith("_") and (
                isinstance(value, property) or inspect.isfunction(value)
            ):
                found.append((attr, value))
    return found


def _documented_objects() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for modname in PUBLIC:
        module = importlib.import_module(modname)
        for name in _public_names(module):
            obj = getattr(module, name)
            if not callable(obj):
                continue  # a constant: no docstring of its own
            found.append((f"{modname}.{name}", obj))
            # A protocol's members are declarations: its class docstring shows them at work.
            if getattr(obj, "_is_protocol", False):
                continue
            if inspect.isclass(obj) and obj.__module__ not in CORE:
                found += [(f"{modname}.{name}.{a}", m) for a, m in _members(obj)]
    return found


def test_every_public_name_has_an_example() -> None:
    missing = sorted({name for name, obj in _documented_objects() if not _runs_an_example(obj)})
    assert missing == []


def _core_members(module: ModuleType) -> list[tuple[str, object]]:
    """The public classes *module* defines and their public methods, properties and attributes.

    Named where defined: a member of a private base (``_Limits``) once, under
    the base. Attributes too (the Decision fields, ``capacity``): in the
    extension they are indistinguishable from properties, so both
    implementations document them alike.
    """
    found: list[tuple[str, object]] = []
    for name, cls in vars(module).items():
        if not inspect.isclass(cls) or cls.__module__ != module.__name__ or name.startswith("_"):
            continue
        found.append((f"{module.__name__}.{name}", cls))
        for base in cls.__mro__:
            if base is not cls and (base.__module__ != module.__name__ or base.__name__[0] != "_"):
                continue
            for attr, member in vars(base).items():
                if not attr.startswith("_") and _is_member(member):
                    found.append((f"{module.__name__}.{base.__name__}.{attr}", _unwrap(member)))
    return found


@pytest.mark.parametrize("name", [p for p in COLLECTED if p.values[0] in CORE])
def test_every_member_of_the_core_has_an_example(name: str) -> None:
    """The core's classes, both implementations: every public method, property and attribute."""
    module = pytest.importorskip(name)
    missing = sorted({n for n, obj in _core_members(module) if not _runs_an_example(obj)})
    assert missing == []


@pytest.mark.c_extension
def test_the_twins_have_the_same_members() -> None:
    """So the check above holds the Cython core to what it holds the pure-Python one."""
    module = pytest.importorskip("nanobucket._core._bucket_c")

    def names(module: ModuleType) -> set[str]:
        return {n.removeprefix(module.__name__) for n, _ in _core_members(module)}

    # AllowAll is all_of's one-call fast path over Cython buckets: no twin.
    c_only = {".AllowAll", ".AllowAll.of", ".AllowAll.allow", ".AllowAll.check"}
    twin = importlib.import_module("nanobucket._core._bucket_py")
    twin_decision = importlib.import_module("nanobucket._core._decision_py")
    assert names(module) - c_only == names(twin) | names(twin_decision)
    assert c_only <= names(module)
    assert ".Decision.allowed" in names(module)


def _api_reference() -> str:
    return API_REFERENCE.read_text(encoding="utf-8")


def test_the_api_reference_names_every_public_name() -> None:
    section = _api_reference()
    quoted = " ".join(re.findall(r"`([^`]+)`", section))
    missing = []
    for modname in PUBLIC:
        for name in _public_names(importlib.import_module(modname)):
            if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", quoted):
                missing.append(f"{modname}.{name}")
    assert missing == []


#: A module or name in the API reference's first column, before its arguments.
_REFERENCE_NAME = re.compile(r"[A-Za-z_][\w.]*")


def _reference_names() -> set[str]:
    """The names the API reference's first column gives, each as ``module.name``.

    A qualified name (``nanobucket.shared.BadTableError``) sets the module for
    the bare names after it in the same cell (``default_directory()``); a
    method (``SharedKeyedTokenBucket.create``) stands for its class; anything
    else (``.open``, ``on_decision=``, ``python -m nanobucket``) names none.
    """
    modules = set(PUBLIC)
    names: set[str] = set()
    for line in _api_reference().splitlines():
        if not line.startswith("| "):
            continue
        module = None
        for token in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            match = _REFERENCE_NAME.match(token)
            if match is None or (match.end() < len(token) and token[match.end()] not in "("):
                continue
            dotted = match.group()
            if dotted in modules and match.end() == len(token):
                continue  # a module itself (``nanobucket.tiered(...)`` is a function)
            qualified = [m for m in modules if dotted.startswith(m + ".")]
            if qualified:
                module = max(qualified, key=len)
                dotted = dotted[len(module) + 1 :]
            if module is not None:
                names.add(f"{module}.{dotted.split('.')[0]}")
    return names


def _canonical_public_names() -> set[str]:
    """Every public name of the PUBLIC modules: ``nanobucket.X`` where the package
    itself exports the same object, else ``module.X`` (once per module that exports it)."""
    import nanobucket

    top = set(nanobucket.__all__)
    names: set[str] = set()
    for modname in PUBLIC:
        module = importlib.import_module(modname)
        for name in _public_names(module):
            if name in top and getattr(nanobucket, name) is getattr(module, name):
                names.add(f"nanobucket.{name}")
            else:
                names.add(f"{modname}.{name}")
    return names


def test_the_api_reference_names_exactly_the_public_names() -> None:
    listed, public = _reference_names(), _canonical_public_names()
    assert (sorted(listed - public), sorted(public - listed)) == ([], [])


#: An example importing a private module (``from nanobucket._http import ...``).
_PRIVATE_IMPORT = re.compile(r"(?:from|import)\s+nanobucket\._")


def _public_docstrings() -> list[tuple[str, str]]:
    """The docstrings the API reference shows: each public name's, and every public
    member's of its class and of the package's bases it inherits them from."""
    found: list[tuple[str, str]] = []
    for name, obj in _documented_objects():
        found.append((name, _own_doc(obj) or ""))
        if not inspect.isclass(obj):
            continue
        for base in obj.__mro__:
            if not base.__module__.startswith("nanobucket"):
                continue
            for attr, member in vars(base).items():
                if not attr.startswith("_") and _is_member(member):
                    found.append((f"{name}.{attr}", _own_doc(member) or ""))
    return found


def test_public_examples_import_public_modules() -> None:
    """A reader copies an example as written: it imports the module the reference names."""
    private = sorted({name for name, doc in _public_docstrings() if _PRIVATE_IMPORT.search(doc)})
    assert private == []
