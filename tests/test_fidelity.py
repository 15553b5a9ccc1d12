"""fidelity.sh --device cpu --tiny: the whole fidelity chain (data, pretrain, convert, align, distill) at a micro
shape, so that the GPU run cannot rot; its table has every row, each with finite numbers."""
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_fidelity_tiny_cpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.fidelity", "--device", "cpu", "--tiny", "--out_dir",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in out.stdout.splitlines() if r.startswith("| ") and not r.startswith(("| run ", "| --- "))}
    assert set(rows) == {"teacher (AR)", "align λ=0", "align λ=10", "OPDLM on-policy", "OPDLM off-policy"}
    for name, (params, steps, quality, value, tpf, step_s, mfu, status) in rows.items():
        assert status == "ok", (name, status)
        assert int(steps) == 3 and math.isfinite(float(value)) and float(step_s) > 0, name
        assert mfu == "-"  # no MFU off a GPU of known peak
        assert params.endswith("M") and float(tpf) >= 1.0, name  # every row has both
    assert float(rows["OPDLM on-policy"][4]) >= 1.0 and float(rows["teacher (AR)"][4]) == 1.0
