"""examples/train_torchrun.py and train_dali.py under a real torchrun: stopped mid-epoch at 2
ranks, resumed at 3, they train on exactly the rest of the epoch; examples/train_lightning.py
under Lightning's own DDP launcher, stopped mid-epoch and resumed from Lightning's checkpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_train_from_hub_indexes_a_hub_webdataset_in_place_and_trains_exact_epochs():
    script = Path(__file__).parents[1] / "examples" / "train_from_hub.py"
    done = subprocess.run(
        [sys.executable, str(script), "--epochs=2", "--num-images=300"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "indexed 3 shards, 300 samples of hf://datasets/demo/webdataset-images/train" in done.stdout
    assert "epoch 0: 300 samples" in done.stdout and "epoch 1: 300 samples" in done.stdout
