"""The test lanes (issue 38, point 4): ``slow`` marks the tests that start servers, torchrun,
Ray, Lightning or DALI; ``tools/test --fast`` (``pytest -m "not slow"``) runs the rest, the
inner loop, and ``tools/test`` runs everything.

- :func:`pytest_collection_modifyitems` marks ``slow`` every test that uses a server fixture of
  ``tests/conftest.py`` (:data:`SERVER_FIXTURES`), directly or through a fixture that depends
  on one (``item.fixturenames`` is the whole closure), or that asks for one by name in its
  code, its fixtures' or a function of their module they call
  (``request.getfixturevalue("azurite")``; every parameter of such a fixture is marked, a
  local one too). A test that starts a server itself, and a module that starts torchrun,
  Lightning, DALI or Ray, says so with ``pytest.mark.slow`` (a module: ``pytestmark =
  pytest.mark.slow``).
- :func:`pytest_runtest_protocol` keeps the lane honest: while a test that is *not* marked
  ``slow`` runs (its set-up, call and teardown), starting a server fails it with "this test
  starts a server: mark it slow", and so does starting ``torchrun`` or ``ray start``. Every
  test server starts through :func:`shardstream.testing.process.spawn` (SeaweedFS, nginx, the
  fault server, the fake Hub, the GCS emulator, Azurite), which is replaced by a guard for
  the whole session (:func:`_install`; it calls the real one whenever no unmarked test is
  running); Ray's ``ray start`` and ``torchrun`` (or ``python -m torch.distributed.run``) are
  caught in :class:`subprocess.Popen`, patched only while an unmarked test runs. The guard
  sees this process only: a subprocess that starts a server (``shardstream demo``, a script
  run under torchrun) needs its mark by hand.

``tests/conftest.py`` imports both hooks: ``from lanes import pytest_collection_modifyitems,
pytest_runtest_protocol``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from shardstream.testing import process

__all__ = ["SERVER_FIXTURES", "pytest_collection_modifyitems", "pytest_runtest_protocol"]

SERVER_FIXTURES = frozenset(
    {
        "s3_server",
        "s3_config",
        "s3_bucket",
        "nginx_server",
        "nginx_tls_server",
        "fake_hub",
        "gcs_emulator",
        "azurite",
        "ray_cluster",
    }
)

_real_spawn = process.spawn
_real_popen_init = subprocess.Popen.__init__
_unmarked: list[pytest.Item] = []  # the test running now, while it is not marked slow


# The test files that take longest (seconds of one process, serial --durations, 2026-11-26),
# run first: pytest-xdist's --dist loadfile hands out files in collection order, so a long file
# collected last keeps one worker busy while the others idle (alphabetically test_torchrun came
# near the end). Refresh with `pytest --durations=0`; a file left out keeps its place after these.
LONGEST_FIRST = (
    "test_examples.py",
    "test_readme.py",
    "test_torchrun.py",
    "test_frameworks.py",
    "test_ray.py",
    "test_cache_share.py",
    "test_ray_pack.py",
    "test_dali.py",
    "test_stores.py",
    "test_remote_datasets.py",
    "test_faults.py",
    "test_s3_server_command.py",
    "test_dali_fields.py",
    "test_pack_scale.py",
    "test_unfinished_pack.py",
    "test_server_lifeline.py",
    "test_cli.py",
    "test_dali_odd.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``slow`` each test that uses a server fixture, directly or not: by name
    (``item.fixturenames``, the closure), or by ``request.getfixturevalue("s3_server")`` in the
    test or one of its fixtures (a server fixture's name as a string literal in their code).
    Puts the files of :data:`LONGEST_FIRST` first, in that order (a file's tests stay together
    and in order)."""
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or _asks_for_a_server(item):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the rest keep their order


def _asks_for_a_server(item: pytest.Item) -> bool:
    functions = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)  # pytest's FuncFixtureInfo: the fixtures of the closure
    for fixturedefs in getattr(info, "name2fixturedefs", {}).values():
        functions += [getattr(fixturedef, "func", None) for fixturedef in fixturedefs]
    seen: set[types.CodeType] = set()
    return any(_names_a_server(function, seen) for function in functions)


def _names_a_server(function: object, seen: set[types.CodeType]) -> bool:
    """Whether ``function``'s code, or a function of its module it calls by name (a fixture's
    ``_s3(request)`` helper), has a server fixture's name as a constant."""
    code = getattr(function, "__code__", None)
    if not isinstance(code, types.CodeType) or code in seen:
        return False
    seen.add(code)
    own = getattr(function, "__globals__", {})
    module = getattr(function, "__module__", None)
    for inner in _codes(code):
        if SERVER_FIXTURES.intersection(c for c in inner.co_consts if isinstance(c, str)):
            return True
        for name in inner.co_names:
            called = own.get(name)
            if isinstance(called, types.FunctionType) and called.__module__ == module:
                if _names_a_server(called, seen):
                    return True
    return False


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code of the functions, lambdas and comprehensions in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Runs ``item`` with the guards armed unless it is marked ``slow``."""
    _install()
    if item.get_closest_marker("slow") is not None:
        return (yield)
    _unmarked.append(item)
    subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]
    try:
        return (yield)
    finally:
        subprocess.Popen.__init__ = _real_popen_init  # type: ignore[method-assign]
        _unmarked.remove(item)


def _fail(what: str, args: Any) -> None:
    item = _unmarked[-1]
    shown = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
    pytest.fail(
        f"this test starts a {what}: mark it slow ({item.nodeid} ran `{shown[:200]}`; a test using a server "
        "fixture is marked by tests/lanes.py, anything else needs pytest.mark.slow)"
    )


def _guarded_spawn(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    if _unmarked:
        _fail("server", args)
    return _real_spawn(args, **kwargs)


def _guarded_popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    if _unmarked:
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
        program = os.path.basename(argv[0]) if argv else ""
        what = "server" if program == "ray" and argv[1:2] == ["start"] else None
        if program == "torchrun" or "torch.distributed.run" in argv[1:3]:
            what = "torchrun job"
        if what:
            self._child_created = False  # what Popen.__del__ reads first
            _fail(what, argv)
    _real_popen_init(self, args, *rest, **kwargs)


def _install() -> None:
    """Points ``spawn`` at the guard in :mod:`shardstream.testing.process` and in every module
    that imported it by name before (``from ...process import spawn``); one imported later gets
    the guard from ``process``. A dictionary lookup per loaded module: no module ``__getattr__``."""
    process.spawn = _guarded_spawn  # type: ignore[assignment]
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType) and module.__dict__.get("spawn") is _real_spawn:
            module.spawn = _guarded_spawn  # type: ignore[attr-defined]
