import ast
import inspect
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import shardstream
from shardstream import errors


def test_all_lists_exactly_the_public_names_and_each_resolves():
    for name in shardstream.__all__:
        assert getattr(shardstream, name) is not None, name
    public = {
        name
        for name, value in vars(shardstream).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    } - {"TYPE_CHECKING", "Any"}
    assert public == set(shardstream.__all__) - {"__version__"}
    assert len(shardstream.__all__) == len(set(shardstream.__all__))


def test_every_error_derives_from_the_base_and_a_builtin():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.ShardstreamError)
        if cls is not errors.ShardstreamError:
            assert any(b.__module__ == "builtins" and b is not Exception for b in inspect.getmro(cls)), name
        assert getattr(shardstream, name) is cls


def test_pack_does_not_import_torch():
    code = "import sys, shardstream; shardstream.pack; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _run_python(code: str) -> None:
    """Runs ``code`` in a fresh interpreter (import order matters) and fails with its stderr."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.slow
def test_old_and_new_homes_of_public_names_import_in_either_order():
    # `shardstream.pack` is the pack function; `from shardstream.pack import Part` (the old
    # home of Part, in the README's examples until the packing/ split) must not replace it.
    for first in ("from shardstream.pack import Part, PackReport", "import shardstream"):
        _run_python(
            f"{first}\n"
            "import shardstream\n"
            "from shardstream.pack import Part, PackReport\n"
            "from shardstream.packing import Part as P2, PackReport as R2, pack\n"
            "assert callable(shardstream.pack) and shardstream.pack is pack\n"
            "assert Part is P2 is shardstream.Part and PackReport is R2 is shardstream.PackReport\n"
            "from shardstream.dataset import STATE_FORMAT, ShardDataset, loader_state_dict\n"
            "assert shardstream.loader_state_dict is loader_state_dict and shardstream.ShardDataset is ShardDataset\n"
            "from shardstream.dali import DaliLoader, gpu_available\n"
            "from shardstream.decode import CpuDecoder, RandomResizedCrop\n"
            "from shardstream.storage import open_store\n"
            "from shardstream.testing import S3ServerInfo, SeaweedS3Server\n"
            "for name in shardstream.__all__:\n"
            "    assert getattr(shardstream, name) is not None, name\n"
        )


def _imports_in(path: Path) -> list[str]:
    """The ``shardstream`` import statements of a Python file, or of a Markdown page's code
    blocks (a block that is not whole Python, e.g. one with ``...``, gives its import lines)."""
    text = path.read_text()
    if path.suffix != ".md":
        return _imports_of(ast.parse(text))
    found = []
    for block in re.findall(r"```(?:python|py)\n(.*?)```", text, flags=re.S):
        try:
            found += _imports_of(ast.parse(textwrap.dedent(block)))
        except SyntaxError:
            lines = re.findall(r"^\s*((?:from|import) shardstream\b.*)$", block, flags=re.M)
            found += [s for line in lines for s in _imports_of(ast.parse(line.split("#")[0]))]
    return found


def _imports_of(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "shardstream":
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "shardstream" for a in node.names):
            found.append(ast.unparse(node))
    return found


@pytest.mark.slow
def test_every_shardstream_import_in_the_readme_docs_and_examples_works():
    root = Path(__file__).resolve().parent.parent
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "examples").glob("*.py"))]
    statements = sorted({line for path in files for line in _imports_in(path)})
    assert any("ShardDataset" in s for s in statements) and any("loader_state_dict" in s for s in statements)
    _run_python("\n".join(statements))


def test_the_library_below_the_dataset_imports_without_torch():
    # The packing half, storage, index and the reading engine run where torch is not wanted
    # (a packing job, a CPU box indexing shards): importing them must not pull torch in.
    _run_python(
        "import importlib, pkgutil, sys, shardstream\n"
        "torch_facing = {'shardstream.dataset', 'shardstream.collate', 'shardstream.dali', 'shardstream.demo', 'shardstream.mapdataset', 'shardstream.tokens.dataset'}\n"
        "for m in pkgutil.walk_packages(shardstream.__path__, 'shardstream.'):\n"
        "    if m.name not in torch_facing and not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "assert 'torch' not in sys.modules, 'imported torch'\n"
        "import shardstream.reading.engine, shardstream.reading.schedule\n"
    )


def test_public_signatures_name_only_public_types():
    """Every shardstream type a public function or method names in its signature is public
    (in ``shardstream.__all__``), so a user can import what they are handed or must pass."""
    import builtins
    import typing

    known = set(shardstream.__all__) | set(dir(builtins)) | set(typing.__all__)
    known |= {"Callable", "Iterator", "Iterable", "Sequence", "Mapping", "PathLike", "Path", "Location", "os"}
    known |= {"ImageFormat", "OnError", "FAIL", "AddressingStyle", "ManifestRow", "Random", "np", "torch", "Tensor"}
    known |= {"RunSlices"}  # FileRun's constructor: the engine makes FileRuns, users only read them
    private = {}
    for name in shardstream.__all__:
        obj = getattr(shardstream, name)
        members = [obj]
        if inspect.isclass(obj):
            members += [m for k, m in vars(obj).items() if not k.startswith("_") and callable(m)]
        for member in members:
            try:
                text = str(inspect.signature(member))
            except (TypeError, ValueError):
                continue
            for word in re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text):
                if word[0].isupper() and word not in known:
                    private.setdefault(f"{name}.{getattr(member, '__name__', '')}", set()).add(word)
    assert not private, private
