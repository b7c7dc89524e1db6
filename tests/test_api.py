import inspect
import subprocess
import sys
import types

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
