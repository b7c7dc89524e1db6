"""The SeaweedFS launcher starts a real authenticated S3 server and leaves nothing behind."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from shardstream import S3Config, ShardDataset, pack
from shardstream.testing import S3ServerError, SeaweedS3Server, s3server


@pytest.mark.slow
def test_server_starts_with_auth_and_stops_leaving_nothing(tmp_path):
    server = SeaweedS3Server()
    info = server.start()
    pid = server._proc.pid
    data_dir = server._tmp_dir
    ports = list(server._ports)
    assert "***" in repr(info) and info.secret_access_key not in repr(info)
    server.create_bucket("roundtrip")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.txt").write_text("x")
    cfg = S3Config(
        endpoint_url=info.endpoint_url, access_key_id=info.access_key_id, secret_access_key=info.secret_access_key
    )
    pack(tmp_path / "src", "s3://roundtrip/p", s3=cfg, progress=False)
    assert [s["txt"] for s in ShardDataset("s3://roundtrip/p", s3=cfg)] == [b"x"]
    server.stop()
    server.stop()  # idempotent
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert not data_dir.exists()
    assert not any(Path(tempfile.gettempdir()).glob(f"seaweedfs-*-grpc-{ports[1]}.sock"))
    with pytest.raises(S3ServerError, match="not running"):
        _ = server.info


def _rig_free_ports(monkeypatch, taken_port: int, times: int) -> list[list[int]]:
    """The launcher's next ``times`` port lists hold ``taken_port`` as the master port (index 2),
    as when another process binds a port between free_ports and weed's own bind."""
    real, handed = s3server.free_ports, []

    def rigged(count: int) -> list[int]:
        ports = real(count)
        if len(handed) < times:
            ports[2] = taken_port
        handed.append(ports)
        return ports

    monkeypatch.setattr(s3server, "free_ports", rigged)
    return handed


@pytest.fixture
def held_port():
    """A port on 127.0.0.1 that this test holds open (listening) until its end."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_port_taken_before_weed_binds_it_starts_again_on_fresh_ports(monkeypatch, held_port):
    handed = _rig_free_ports(monkeypatch, held_port, times=1)
    with SeaweedS3Server() as server:
        server.create_bucket("after-retry")
        assert len(handed) == 2 and held_port not in server._ports
        assert server._ports == handed[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ports_taken_on_every_start_give_up_with_weeds_words(monkeypatch, held_port):
    handed = _rig_free_ports(monkeypatch, held_port, times=10)
    server = SeaweedS3Server()
    with pytest.raises(S3ServerError, match=rf"exited with code 1 during startup.*port {held_port} for Master"):
        server.start()
    assert len(handed) == 3  # _PORT_ATTEMPTS starts, then the error
    assert server._proc is None and server._tmp_dir is None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_given_s3_port_that_is_taken_is_not_tried_again(monkeypatch, held_port):
    handed = _rig_free_ports(monkeypatch, -1, times=0)
    with pytest.raises(S3ServerError, match="exited with code|did not answer"):
        SeaweedS3Server(s3_port=held_port, startup_timeout_s=20).start()
    assert len(handed) == 1


def test_missing_binary_is_a_clear_error(tmp_path):
    with pytest.raises(S3ServerError, match="not executable"):
        SeaweedS3Server(weed_path=str(tmp_path / "weed")).start()


def test_demo_falls_back_to_a_local_directory_when_the_server_cannot_start(tmp_path, monkeypatch, capsys):
    from shardstream.demo import run_demo

    def refuse(self):
        raise S3ServerError("weed did not answer (simulated)")

    monkeypatch.setattr(SeaweedS3Server, "start", refuse)
    result = run_demo(num_images=64, num_workers=0, batch_size=16, workdir=str(tmp_path))
    out = capsys.readouterr().out
    assert "could not start the local S3 server (weed did not answer (simulated)); packing to" in out
    assert result.dest == str(tmp_path / "shards") and result.num_unique_keys == result.num_samples == 64


def test_make_image_dataset_without_cls_files_is_a_tree_of_class_folders(tmp_path):
    from shardstream.testing import CLASS_NAMES, make_image_dataset

    total = make_image_dataset(tmp_path, num_images=6, num_classes=3, min_side_px=16, max_side_px=24, cls_files=False)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == [
        f"{CLASS_NAMES[i % 3]}/{i:06d}.jpg" for i in sorted(range(6), key=lambda i: (CLASS_NAMES[i % 3], i))
    ]
    assert total == sum(p.stat().st_size for p in tmp_path.rglob("*.jpg"))
