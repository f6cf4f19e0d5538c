"""The benchmark script runs end to end (a small smoke run; the figures come from full runs)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).parent.parent / "bench" / "run.py"


def test_bench_quick_run_writes_ratios(tmp_path):
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--models", "elementwise_chain,mlp",
                          "--repeat", "1", "--json", str(out_json)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "vs TVM" in out.stdout and "geomean" in out.stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["model"] for r in rows] == ["elementwise_chain", "mlp"]
    assert all(r["ok"] and r["ours_ms"] > 0 and r["tvm_ms"] > 0 and r["torch_ms"] > 0 for r in rows)
