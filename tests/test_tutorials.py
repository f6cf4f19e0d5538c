"""Every tutorial runs, in its short mode (``--quick``), as a newcomer would run it."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).parent.parent / "tutorials").glob("[0-9]*.py"))


def test_tutorials_exist():
    assert TUTORIALS, "no tutorials found"


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs_in_quick_mode(path):
    out = subprocess.run([sys.executable, str(path), "--quick"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "matches" in out.stdout or "OK" in out.stdout
