"""examples/train_torchrun.py and train_dali.py under a real torchrun: stopped mid-epoch at 2
ranks, resumed at 3, they train on exactly the rest of the epoch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from test_torchrun import free_port

SCRIPT = Path(__file__).parents[1] / "examples" / "train_torchrun.py"


def torchrun(nproc: int, *args: str, script: Path = SCRIPT) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", str(script), *args]
    run = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_train_torchrun_checkpoints_and_resumes_at_another_world_size(tmp_path):
    common = [f"--workdir={tmp_path / 'work'}", f"--checkpoint={tmp_path / 'ckpt.pt'}", "--epochs=1",
              "--batch-size=16", "--num-workers=1", "--size-px=32"]
    out = torchrun(2, *common, "--stop-after-steps=5")
    assert "stopping after 5 steps, 80 samples into epoch 0" in out
    out = torchrun(3, *common)
    left = int(re.search(r"epoch 0, (\d+) samples per rank left at world size 3", out).group(1))
    assert left == -(-(600 - 2 * 80) // 3)  # the 440 samples not trained on, over 3 ranks
    assert re.search(rf"epoch 0: {3 * left} samples on 3 ranks \({left} on rank 0\)", out), out


def test_train_dali_runs_on_the_cpu_and_resumes(tmp_path):
    script = SCRIPT.with_name("train_dali.py")
    common = [f"--workdir={tmp_path / 'work'}", f"--checkpoint={tmp_path / 'ckpt.pt'}", "--epochs=1",
              "--batch-size=16", "--size-px=32"]
    out = torchrun(2, *common, "--stop-after-steps=5", script=script)
    assert "DALI decodes on the CPU" in out and "stopping after 5 steps, 80 samples into epoch 0" in out
    out = torchrun(3, *common, script=script)
    left = -(-(600 - 2 * 80) // 3)
    assert f"epoch 0, {-(-left // 16)} batches per rank left" in out
    assert f"epoch 0: {3 * left} samples on 3 ranks" in out, out
