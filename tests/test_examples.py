"""examples/train_torchrun.py and train_dali.py under a real torchrun: stopped mid-epoch at 2
ranks, resumed at 3, they train on exactly the rest of the epoch; examples/train_lightning.py
under Lightning's own DDP launcher, stopped mid-epoch and resumed from Lightning's checkpoint;
examples/pack_from_parquet.py and pack_from_hf_dataset.py pack, read back and check every row,
and exit with an error when a row did not come back; examples/train_from_hub.py indexes a
WebDataset on a fake Hub (servers.hub) in place and trains from it. Examples import nothing of
shardstream.testing but its public names, and that package (in the wheel) stays small."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_torchrun import free_port

SCRIPT = Path(__file__).parents[1] / "examples" / "train_torchrun.py"


def torchrun(nproc: int, *args: str, script: Path = SCRIPT) -> str:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(script),
        *args,
    ]
    run = subprocess.run(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.slow
def test_train_torchrun_checkpoints_and_resumes_at_another_world_size(tmp_path):
    common = [
        f"--workdir={tmp_path / 'work'}",
        f"--checkpoint={tmp_path / 'ckpt.pt'}",
        "--epochs=1",
        "--batch-size=16",
        "--num-workers=1",
        "--size-px=32",
    ]
    out = torchrun(2, *common, "--stop-after-steps=5")
    assert "stopping after 5 steps, 80 samples into epoch 0" in out
    out = torchrun(3, *common)
    left = int(re.search(r"epoch 0, (\d+) samples per rank left at world size 3", out).group(1))
    assert left == -(-(600 - 2 * 80) // 3)  # the 440 samples not trained on, over 3 ranks
    assert re.search(rf"epoch 0: {3 * left} samples on 3 ranks \({left} on rank 0\)", out), out


@pytest.mark.slow
def test_train_dali_runs_on_the_cpu_and_resumes(tmp_path):
    script = SCRIPT.with_name("train_dali.py")
    common = [
        f"--workdir={tmp_path / 'work'}",
        f"--checkpoint={tmp_path / 'ckpt.pt'}",
        "--epochs=1",
        "--batch-size=16",
        "--size-px=32",
    ]
    out = torchrun(2, *common, "--stop-after-steps=5", script=script)
    assert "DALI decodes on the CPU" in out and "stopping after 5 steps, 80 samples into epoch 0" in out
    out = torchrun(3, *common, script=script)
    left = -(-(600 - 2 * 80) // 3)
    assert f"epoch 0, {-(-left // 16)} batches per rank left" in out
    assert f"epoch 0: {3 * left} samples on 3 ranks" in out, out


@pytest.mark.slow
def test_train_lightning_resumes_from_its_checkpoint_with_two_devices(tmp_path):
    script = SCRIPT.with_name("train_lightning.py")
    common = [
        sys.executable,
        str(script),
        f"--workdir={tmp_path / 'work'}",
        f"--checkpoint-dir={tmp_path / 'ckpt'}",
        "--devices=2",
        "--epochs=2",
        "--batch-size=16",
        "--size-px=32",
    ]

    def run(*args: str) -> str:
        done = subprocess.run(
            [*common, *args],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=300,
            cwd=script.parent,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    out = run("--stop-after-steps=5")
    assert "stopped after 5 steps" in out and "epoch 0: 160 samples on 2 ranks in this run" in out
    out = run()
    # 600 samples: the 440 left of epoch 0 (none again, none lost), then all of epoch 1, which
    # the dataset reached with no set_epoch call
    assert "epoch 0: 440 samples on 2 ranks in this run (dataset epoch 0)" in out, out[-3000:]
    assert "epoch 1: 600 samples on 2 ranks in this run (dataset epoch 1)" in out, out[-3000:]


def make_hub_webdataset(folder: Path, num_images: int) -> None:
    """``.jpg`` images with ``.cls`` labels 0..3 in ``folder/train/shard-NNNNN.tar``, 100 a shard,
    written by webdataset's TarWriter (as a WebDataset on the Hub is)."""
    import io

    import torch
    import webdataset as wds
    from PIL import Image

    shards = folder / "train"
    shards.mkdir(parents=True)
    rng = torch.Generator().manual_seed(0)
    per_shard = 100
    for s in range(0, num_images, per_shard):
        with wds.TarWriter(str(shards / f"shard-{s // per_shard:05d}.tar")) as sink:
            for i in range(s, min(s + per_shard, num_images)):
                label = i % 4
                pixels = (torch.rand(64, 64, 3, generator=rng) * 80 + label * 50).to(torch.uint8).numpy()
                jpeg = io.BytesIO()
                Image.fromarray(pixels).save(jpeg, format="JPEG", quality=90)
                sink.write({"__key__": f"{i:06d}", "jpg": jpeg.getvalue(), "cls": label})


@pytest.mark.slow
def test_train_from_hub_indexes_a_hub_webdataset_in_place_and_trains_exact_epochs(tmp_path):
    from servers.hub import FakeHub

    make_hub_webdataset(tmp_path / "repo", 300)
    script = Path(__file__).parents[1] / "examples" / "train_from_hub.py"
    with FakeHub() as hub:
        hub.add_repo("demo/webdataset-images", {hub.commit_sha("first commit"): tmp_path / "repo"})
        done = subprocess.run(
            [sys.executable, str(script), "hf://datasets/demo/webdataset-images/train", "--epochs=2"],
            env={**os.environ, "OMP_NUM_THREADS": "1", **hub.env()},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "indexed 3 shards, 300 samples of hf://datasets/demo/webdataset-images/train" in done.stdout
    assert "epoch 0: 300 samples" in done.stdout and "epoch 1: 300 samples" in done.stdout


@pytest.mark.slow
def test_train_from_hub_needs_a_hub_url():
    script = Path(__file__).parents[1] / "examples" / "train_from_hub.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "usage: train_from_hub.py" in done.stderr and "shards" in done.stderr, done.stderr


def test_examples_import_only_the_public_testing_names():
    """What examples use of shardstream.testing is its public API (the S3 server, synthetic
    images), never a test server (tests/servers) or another test module."""
    import ast

    import shardstream.testing

    public = set(shardstream.testing.__all__)
    examples = sorted((Path(__file__).parents[1] / "examples").glob("*.py"))
    assert examples
    bad = []
    for path in examples:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imports = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                imports = [(node.module or "", alias.name) for alias in node.names]
            else:
                continue
            for module, name in imports:
                where = f"{path.name}:{node.lineno}: {module}{'' if name is None else '.' + name}"
                top = module.split(".")[0]
                if top in ("servers", "conftest") or top.startswith("test_"):
                    bad.append(where)
                elif module == "shardstream.testing" or module.startswith("shardstream.testing."):
                    if module != "shardstream.testing" or (name is not None and name not in public):
                        bad.append(where)
    assert not bad, bad


def test_the_installed_testing_package_stays_small():
    """shardstream.testing ships in the wheel: the S3 server, synthetic images, what they need;
    the test servers stay in tests/servers (issue 38: at most 1000 lines; issue 51 added the
    lifeline every server needs to go with its parent, SIGKILL included, with the clean-up of
    what a killed one left: at most 1500)."""
    package = Path(__file__).parents[1] / "shardstream" / "testing"
    lines = {path.name: path.read_bytes().count(b"\n") for path in sorted(package.glob("*.py"))}
    assert sum(lines.values()) <= 1500, lines


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(__file__).parents[1] / "examples" / name
    return subprocess.run(
        [sys.executable, str(script), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_pack_from_parquet_packs_row_groups_to_a_local_s3_server_and_reads_every_row_back():
    done = run_example("pack_from_parquet.py", "--rows=120", "--workers=2")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "made captions.parquet: 120 rows in 5 row groups" in out, out
    assert "started a local S3 server (SeaweedFS)" in out, out
    assert "packed 5 inputs (120 samples," in out, out
    assert "index s3://examples/captions/index.bin: 2 shards, 120 samples" in out, out
    assert "read 120 samples from 2 shards" in out, out
    assert "all 120 rows came back once, captions, labels and image sizes equal" in out, out


@pytest.mark.slow
def test_pack_from_parquet_in_two_parts_and_fails_on_a_dataset_of_other_rows(tmp_path):
    dest = str(tmp_path / "captions")
    done = run_example("pack_from_parquet.py", f"--dest={dest}", "--rows=80", "--workers=1", "--part=0/2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this part is done; the last part to finish writes the index" in done.stdout, done.stdout
    assert "read " not in done.stdout
    done = run_example("pack_from_parquet.py", f"--dest={dest}", "--rows=80", "--workers=2", "--part=1/2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "packed 2 inputs (30 samples," in done.stdout, done.stdout  # row groups 1 and 3 of 0..3
    assert "all 80 rows came back once" in done.stdout, done.stdout

    other = str(tmp_path / "other")
    assert run_example("pack_from_parquet.py", f"--dest={other}", "--rows=50", "--workers=1").returncode == 0
    # the same pack over more rows: pack_samples finds the dataset complete; the check does not
    done = run_example("pack_from_parquet.py", f"--dest={other}", "--rows=60", "--workers=1")
    assert done.returncode != 0
    assert "nothing to do" in done.stdout and "all 60 rows" not in done.stdout, done.stdout
    assert "MISMATCH: 60 rows, 50 samples read, 50 distinct keys, 10 rows missing" in done.stderr, done.stderr


@pytest.mark.slow
def test_pack_from_hf_dataset_writes_the_same_samples_with_shard_writer_and_pack_samples(tmp_path):
    done = run_example("pack_from_hf_dataset.py", f"--dest={tmp_path}", "--rows=90", "--workers=2")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "made a datasets.Dataset of 90 rows" in out, out
    assert "ShardWriter: packed 90 samples (" in out, out
    assert f"index {tmp_path}/shard_writer/index.bin: 2 shards, 90 samples" in out, out
    assert "pack_samples: packed 2 inputs (90 samples," in out, out
    assert f"index {tmp_path}/pack_samples/index.bin: 2 shards, 90 samples" in out, out
    assert "read back 90 samples written by ShardWriter and 90 by pack_samples" in out, out
    assert "both datasets hold the same 90 samples, equal to the source rows" in out, out


@pytest.mark.slow
def test_pack_from_hf_dataset_check_exits_on_a_difference():
    import importlib.util

    path = Path(__file__).parents[1] / "examples" / "pack_from_hf_dataset.py"
    spec = importlib.util.spec_from_file_location("pack_from_hf_dataset", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    dataset = example.make_dataset(3)
    good = {
        f"{i:08d}": ("digest", image.size, label, text)
        for i, (image, label, text) in enumerate(zip(dataset["image"], dataset["label"], dataset["text"]))
    }
    example.check(good, dict(good), dataset)  # equal: no exit
    wrong_caption = {**good, "00000001": (*good["00000001"][:3], "another caption")}
    missing = {key: value for key, value in good.items() if key != "00000002"}
    for written, packed, why in [
        (good, wrong_caption, "1 keys differ between them (e.g. ['00000001'])"),
        (wrong_caption, wrong_caption, "1 unlike their source row (e.g. ['00000001'])"),
        (good, missing, "pack_samples' 2; 1 keys differ between them (e.g. ['00000002'])"),
    ]:
        with pytest.raises(SystemExit, match=re.escape(why)):
            example.check(written, packed, dataset)


@pytest.mark.slow
def test_train_imagefolder_packs_class_folders_with_odd_names_trains_and_validates():
    """The README's class-folder quickstart end to end: .JPEG, .JPG, multi-dot, nested, PNG and
    WebP files under four class folders; labels from the folders, validation with Resize +
    CenterCrop reaching the accuracy a colour-coded task allows."""
    done = run_example("train_imagefolder.py", "--epochs=2", "--num-workers=2")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "packed 240 files (240 samples," in out, out  # each file its own sample, none merged
    assert "classes: ['n01440764', 'n01443537', 'n01484850', 'n01491361']" in out, out
    assert "epoch 0: 240 samples" in out and "epoch 1: 240 samples" in out, out
    assert "packed 60 files (60 samples," in out, out
    accuracy = float(re.search(r"validation: 60 samples, accuracy ([\d.]+)%", out).group(1))
    assert accuracy >= 50.0, out  # chance is 25%


def _losses(out: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step \d+ loss ([0-9.]+)$", out, re.MULTILINE)]


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["position_ids", "cu_seqlens"])
def test_pretrain_tokens_learns_with_document_masks_and_resumes(tmp_path, mask):
    # The example packs a synthetic corpus with a tokenizer trained on the spot, trains a small
    # GPT on token blocks with a document mask, checkpoints, and a second run resumes from it.
    script = Path(__file__).parents[1] / "examples" / "pretrain_tokens.py"
    common = [sys.executable, str(script), f"--workdir={tmp_path}", f"--mask={mask}", "--save-every=10"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run([*common, "--steps=40"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    losses = _losses(first.stdout)
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])  # it learns: the corpus is far from random
    assert (tmp_path / "tokens" / "tokens.bin").exists() and (tmp_path / "checkpoint.pt").exists()
    again = subprocess.run([*common, "--steps=5", "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.findall(r"^step (\d+) ", again.stdout, re.MULTILINE)[0] == "41"  # it went on from the checkpoint
    assert _losses(again.stdout)[0] < np.mean(losses[:5])


@pytest.mark.slow
def test_pretrain_tokens_under_torchrun_resumes_at_another_world_size(tmp_path):
    script = Path(__file__).parents[1] / "examples" / "pretrain_tokens.py"
    torchrun(2, f"--workdir={tmp_path}", "--steps=12", "--save-every=6", script=script)
    out = torchrun(1, f"--workdir={tmp_path}", "--steps=3", "--resume", script=script)
    assert re.findall(r"^step (\d+) ", out, re.MULTILINE) == ["13", "14", "15"]
