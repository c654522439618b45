"""The user-script guide works as written: `examples/train_save_load.py` trains under FSDP with torchrun on 2 gloo
ranks and saves with save_lora; a fresh process loads the adapter with plain peft, reproduces the trained model's
logits and generates."""
import os, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT/"examples"/"train_save_load.py"

def _run(args, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    cmd = " ".join(map(str, args))
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p.stdout

@pytest.mark.parametrize("fsdp", ["fsdp2"])
def test_torchrun_then_plain_peft(tmp_path, fsdp):
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
                "train", str(tmp_path), "--steps", "3", "--fsdp", fsdp])
    assert "step 2: loss" in out and "adapter_model.safetensors" in out, out
    gen = _run([sys.executable, str(SCRIPT), "generate", str(tmp_path)])
    assert "max |logits - trained logits|" in gen and "generated: [" in gen, gen
    assert len(gen.split("generated: [")[1].split("]")[0].split(",")) == 8, gen
