"""The tests' isolation from this machine (tests/isolation.py, issue 38 points 2 and 3): no
variable of the user's environment reaches a test or its processes, each test has a HOME of its
own, a whole session run in a hostile environment passes, and a kill test removes the
semaphores of the processes it killed and no other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import isolation
import pytest

from shardstream.config import S3Config
from shardstream.packing.parts import part_from_env
from shardstream.reading.assign import current_slot
from shardstream.storage.hf import hf_token

HOSTILE = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "SLURM_ARRAY_TASK_ID": "1",
    "SLURM_ARRAY_TASK_COUNT": "2",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
    "AWS_ACCESS_KEY_ID": "AKIAUSERS",
    "HF_TOKEN": "x",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9",
    "AZURE_STORAGE_CONNECTION_STRING": "AccountName=user;AccountKey=eA==",
    "RAY_ADDRESS": "127.0.0.1:9",
    "SSL_CERT_FILE": "/nonexistent.pem",
    "SHARDSTREAM_TEST_FLAG": "/nonexistent",
    "GITHUB_TOKEN": "ghp_users",
}
_homes_seen: list[str] = []


_VIEW = f"""
import json, os, sys
from pathlib import Path
if {str(Path(__file__).parent)!r} not in sys.path:
    sys.path.insert(0, {str(Path(__file__).parent)!r})
import isolation
view = {{
    "scrubbed": isolation.scrubbed(os.environ),
    "home": os.environ.get("HOME"),
    "path_home": str(Path.home()),
    "xdg_cache": os.environ.get("XDG_CACHE_HOME"),
}}
"""


def _view() -> dict:
    """What a test (or, run with -c, a process it starts) sees of the environment."""
    scope: dict = {}
    exec(_VIEW, scope)
    return scope["view"]


def test_the_list_names_what_the_issue_names_and_keeps_the_run_switches():
    for name in [*HOSTILE, "https_proxy", "NO_PROXY", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "HUGGING_FACE_HUB_TOKEN"]:
        assert isolation.is_scrubbed(name), name
    for name in ["GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "AZURE_CLIENT_SECRET", "REQUESTS_CA_BUNDLE"]:
        assert isolation.is_scrubbed(name), name
    for name in ["PATH", "TMPDIR", "LANG", "CUDA_VISIBLE_DEVICES", "SHARDSTREAM_NO_DALI", "AZURITE_BIN", "HOME"]:
        assert not isolation.is_scrubbed(name), name


@pytest.mark.parametrize("which", ["first", "second"])
def test_env_a_test_sees_no_user_variable_and_a_fresh_home_of_its_own(which):
    view = _view()
    assert view["scrubbed"] == []
    home = Path(view["home"])
    assert view["path_home"] == str(home) and home.is_dir() and not any(home.iterdir())  # fresh, empty
    assert Path(tempfile.gettempdir()) in home.parents and home.name != "session"
    assert view["xdg_cache"] == str(home / ".cache")
    assert view["home"] not in _homes_seen  # each test its own
    _homes_seen.append(view["home"])
    # what shardstream reads from the environment falls to its defaults
    assert hf_token() is None
    assert S3Config().resolved_endpoint_url() is None
    assert part_from_env() is None
    slot = current_slot()
    assert (slot.rank, slot.world_size) == (0, 1)
    # per-user state a test leaves behind does not reach the next test
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text(f"hf_left_by_{which}")
    assert hf_token() == f"hf_left_by_{which}"


def test_env_a_process_a_test_starts_sees_the_same():
    run = subprocess.run(
        [sys.executable, "-c", _VIEW + "print(json.dumps(view))"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == _view()
    assert _view()["scrubbed"] == []


@pytest.mark.slow
def test_a_whole_session_in_a_hostile_environment_passes(tmp_path):
    """pytest run in a subprocess with the user's rank, proxies, credentials and a HOME holding a
    Hub token and an AWS configuration: its tests see none of them."""
    user_home = tmp_path / "user"
    (user_home / ".cache" / "huggingface").mkdir(parents=True)
    (user_home / ".cache" / "huggingface" / "token").write_text("hf_users_own_token")
    (user_home / ".aws").mkdir()
    (user_home / ".aws" / "config").write_text("[default]\nendpoint_url = http://127.0.0.1:9\n")
    env = {**os.environ, **HOSTILE, "HOME": str(user_home), "XDG_CACHE_HOME": str(user_home / ".cache")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-k", "test_env_", "-p", "no:cacheprovider", "-q"],
        cwd=Path(__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-4000:]


# ------------------------------------------------------------------ killed processes' semaphores

_HOLDER = """
import multiprocessing, sys
lock = multiprocessing.get_context("spawn").Lock()  # a named semaphore, as spawned workers share
print("/dev/shm/sem." + lock._semlock.name.lstrip("/"), flush=True)
sys.stdin.read()  # until told to go (or killed)
"""


def _holder(**kwargs) -> tuple[subprocess.Popen, Path]:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kwargs
    )
    return process, Path(process.stdout.readline().strip())


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_kill_test_removes_the_semaphores_of_what_it_killed_and_no_other(reap_killed_semaphores):
    other, others_semaphore = _holder()  # another's, made while the test runs
    killed, killed_semaphore = _holder(start_new_session=True)
    try:
        assert others_semaphore.exists() and killed_semaphore.exists()
        reap_killed_semaphores.before_killpg(killed.pid)
        assert killed_semaphore in reap_killed_semaphores.recorded
        assert others_semaphore not in reap_killed_semaphores.recorded
        os.killpg(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=30)
        assert killed_semaphore.exists()  # SIGKILLed: nothing unlinked it
        reap_killed_semaphores.reap()
        assert not killed_semaphore.exists()
        assert others_semaphore.exists()
    finally:
        other.communicate("", timeout=60)  # the other ends normally and unlinks its own
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
            killed.communicate(timeout=30)
        killed_semaphore.unlink(missing_ok=True)
    assert not others_semaphore.exists()


def test_before_killpg_refuses_the_test_runs_own_group(reap_killed_semaphores):
    with pytest.raises(ValueError, match="own process group"):
        reap_killed_semaphores.before_killpg(os.getpgid(0))


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_processes_a_failed_test_stopped_but_never_killed_are_resumed_with_their_semaphores():
    from isolation import KilledSemaphores, _stat

    holder, semaphore = _holder(start_new_session=True)
    killed = KilledSemaphores()
    try:
        killed.before_killpg(holder.pid)
        assert semaphore in killed.recorded and _stat(holder.pid)[0] in "Tt"
        killed.reap()  # the test failed before its kill
        deadline = time.monotonic() + 10
        while _stat(holder.pid)[0] in "Tt" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _stat(holder.pid)[0] not in "Tt" and semaphore.exists()
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGCONT)  # whatever happened above, not left stopped
        holder.communicate("", timeout=60)
    assert not semaphore.exists()  # it ended normally and unlinked its own
