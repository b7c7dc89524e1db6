"""The named readers of the environment in ``shardstream.config``: what each module asks for
(torchrun's and Slurm's variables, Ray's address, the CA paths and proxies, the Hub's endpoint
and token, the GCS emulator, Azure's account), each read when asked, None or its default where
not set; and the stores and pack's part take what they say."""

from __future__ import annotations

import pytest

from shardstream import config
from shardstream.config import (
    azure_account_name,
    azure_connection_string,
    azure_storage_env,
    gcs_emulator_host,
    hf_endpoint,
    hf_token,
    http_proxy,
    ray_address,
    slurm_array_env,
    ssl_cert_paths,
    torchrun_env,
)
from shardstream.packing.parts import Part, part_from_env

pytestmark = pytest.mark.timeout(60)


def test_every_name_a_reader_asks_for_is_listed():
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "RAY_ADDRESS"):
        assert name in config.ENVIRONMENT, name
    for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_STEP", "HTTPS_PROXY", "NO_PROXY", "HF_TOKEN_PATH"):
        assert name in config.ENVIRONMENT, name


def test_torchrun_variables_as_set_and_the_node_from_group_rank_else_node_rank(monkeypatch):
    assert torchrun_env() == config.TorchrunEnv(None, None, None, None, None)
    for name, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NODE_RANK", "3")
    got = torchrun_env()
    assert (got.rank, got.world_size, got.local_rank, got.local_world_size, got.node_rank) == ("5", "8", "1", "4", "3")
    monkeypatch.setenv("GROUP_RANK", "1")
    assert torchrun_env().node_rank == "1"
    assert part_from_env() == Part(5, 8)


def test_a_slurm_array_and_the_part_it_gives(monkeypatch):
    assert slurm_array_env() == config.SlurmArrayEnv(None, None, {"MIN": None, "MAX": None, "STEP": None})
    for name, value in {"ID": "5", "COUNT": "3", "MIN": "1", "MAX": "5", "STEP": "2"}.items():
        monkeypatch.setenv(f"SLURM_ARRAY_TASK_{name}", value)
    assert slurm_array_env() == config.SlurmArrayEnv("5", "3", {"MIN": "1", "MAX": "5", "STEP": "2"})
    assert part_from_env() == Part(2, 3)


def test_ray_ssl_and_proxies(monkeypatch):
    assert ray_address() is None and ssl_cert_paths() == (None, None)
    assert http_proxy("https", "example.com") is None
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ca.pem")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    assert ray_address() == "ray://head:10001" and ssl_cert_paths() == ("/etc/ca.pem", None)
    assert http_proxy("https", "example.com") == "http://proxy:3128"
    assert http_proxy("https", "internal.example") is None


def test_the_hub_endpoint_and_token_chain(monkeypatch, tmp_path):
    assert hf_endpoint() == "https://huggingface.co" and hf_token() is None
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert hf_endpoint() == "http://127.0.0.1:9"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("hf_from_home\n")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_token() == "hf_from_home"
    (tmp_path / "elsewhere").write_text("hf_from_path")
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "elsewhere"))
    assert hf_token() == "hf_from_path"
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_old_name")
    assert hf_token() == "hf_old_name"
    monkeypatch.setenv("HF_TOKEN", " hf_new_name ")
    assert hf_token() == "hf_new_name"


@pytest.mark.parametrize("value", [None, "", "default"])
def test_real_gcs_unless_an_emulator_is_named(monkeypatch, value):
    if value is not None:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", value)
    assert gcs_emulator_host() is None
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert gcs_emulator_host() == "127.0.0.1:4443"


def test_azure_variables(monkeypatch):
    assert azure_connection_string() == "" and azure_account_name() is None and azure_storage_env() == ()
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=acct;AccountKey=k")
    assert azure_account_name() == "acct" and azure_connection_string().startswith("AccountName=acct")
    assert dict(azure_storage_env()) == {
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;AccountKey=k",
    }


def _worker_openblas_threads(job, advance) -> str | None:
    """A pack worker's job: what OPENBLAS_NUM_THREADS it was started with."""
    return config.env("OPENBLAS_NUM_THREADS")


def _as_is(exc: BaseException, stream: int) -> BaseException:
    return exc


@pytest.mark.parametrize("user_value", [None, "3"])
def test_pack_workers_start_with_one_openblas_thread_unless_the_user_says(monkeypatch, user_value) -> None:
    """The worker processes pack starts get OPENBLAS_NUM_THREADS=1 (they do no linear algebra;
    idle OpenBLAS threads spin at numpy's import) unless the user set it; this process's own
    environment is as it was."""
    from types import SimpleNamespace

    from shardstream.packing.workers import run_in_processes

    if user_value is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", user_value)
    jobs = [SimpleNamespace(stream=0), SimpleNamespace(stream=1)]
    seen = run_in_processes(jobs, _worker_openblas_threads, lambda a, b: None, name="test", error=_as_is)
    assert seen == [user_value or "1"] * 2
    assert config.env("OPENBLAS_NUM_THREADS") == user_value


def test_child_env_takes_only_listed_names() -> None:
    with pytest.raises(KeyError, match="NOT_A_SHARDSTREAM_VARIABLE"):
        with config.child_env({"NOT_A_SHARDSTREAM_VARIABLE": "1"}):
            pass
