"""The tuning record database: append and reload, best and resume keys, and what a killed
run or a damaged file leaves behind."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from schedules import database
from schedules.database import VERSION, TuningDatabase, TuningRecord, candidate_key


def rec(task="t0", target="llvm", tile=8, times=(1.0, 2.0, 3.0), error=None, **kw) -> TuningRecord:
    return TuningRecord(task=task, target=target, candidate={"policy": "tile", "knobs": {"tile": tile}},
                        times_ms=list(times), error=error, **kw)


def test_append_reload_keeps_every_field(tmp_path):
    path = tmp_path / "sub" / "db.jsonl"  # the parent directory is created
    db = TuningDatabase(path)
    first = rec(tile=8, times=[3.0, 1.0, 2.0], features=[0.5, 2.0], kernel="k_add")
    db.append(first)
    db.append(rec(tile=16, times=[], error="run: crashed (signal 11, SIGSEGV)"))
    db.append(rec(task="t1", tile=4))
    assert len(db) == 3
    again = TuningDatabase(path)
    assert len(again) == 3
    loaded = again.records("t0", "llvm")[0]
    assert loaded == first
    assert (loaded.median_ms, loaded.version, loaded.features) == (2.0, VERSION, [0.5, 2.0])
    assert again.records("t0", "llvm")[1].median_ms == math.inf
    assert [r.task for r in again.records()] == ["t0", "t0", "t1"]
    assert [r.task for r in again.records(target="llvm")] == ["t0", "t0", "t1"]
    assert again.records(task="t1")[0].candidate == {"policy": "tile", "knobs": {"tile": 4}}
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["target"] == "llvm" for line in lines)


def test_best_is_the_lowest_median_among_successes(tmp_path):
    db = TuningDatabase(tmp_path / "db.jsonl")
    assert db.best("t0", "llvm") is None
    db.append(rec(tile=1, times=[5.0, 5.0, 5.0]))
    db.append(rec(tile=2, times=[1.0, 9.0, 9.0]))  # lowest single time, median 9
    db.append(rec(tile=3, times=[4.0, 4.0, 100.0]))  # median 4: the best
    db.append(rec(tile=4, times=[0.1], error="run: timeout after 2 s"))  # failures never win
    db.append(rec(tile=5, times=[0.01], target="other"))  # another target
    assert db.best("t0", "llvm").candidate["knobs"]["tile"] == 3
    assert TuningDatabase(db.path).best("t0", "llvm").candidate["knobs"]["tile"] == 3
    assert db.best("t0", "other").candidate["knobs"]["tile"] == 5


def test_measured_keys_let_a_rerun_skip_what_is_done(tmp_path):
    db = TuningDatabase(tmp_path / "db.jsonl")
    space = [{"policy": "tile", "knobs": {"tile": t}} for t in (1, 2, 4, 8)]
    for c in space[:2]:
        db.append(TuningRecord("t0", "llvm", c, [1.0]))
    db.append(TuningRecord("t0", "llvm", space[2], [], error="build: bad"))  # failed: measured all the same
    resumed = TuningDatabase(db.path)
    done = resumed.measured_keys("t0", "llvm")
    assert done == {candidate_key(c) for c in space[:3]}
    assert [c for c in space if candidate_key(c) not in done] == [space[3]]
    # key order inside the candidate does not matter
    assert candidate_key({"knobs": {"tile": 1}, "policy": "tile"}) in done
    assert resumed.measured_keys("t1", "llvm") == set()


def test_a_record_that_could_not_be_read_back_is_not_written(tmp_path):
    db = TuningDatabase(tmp_path / "db.jsonl")
    with pytest.raises(ValueError, match=r"task 't0': fields \['features'\]"):
        db.append(rec(features=[1.0, float("nan")]))
    with pytest.raises(ValueError, match=r"\['times_ms'\]"):
        db.append(rec(times=[1.0, float("inf")]))
    assert len(db) == 0 and not db.path.exists()


def test_corrupt_line_in_the_middle_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "db.jsonl"
    db = TuningDatabase(path)
    db.append(rec(tile=1))
    good = rec(tile=2).to_json()
    bad_lines = ['{"task": "t0", "target"', "not json at all", '{"task": "t0"}', "[1, 2]",
                 good.replace('"times_ms":[1.0,2.0,3.0]', '"times_ms":"fast"'),
                 good.replace("/records-1", "/records-99")]
    with open(path, "a") as f:
        f.write("\n".join(bad_lines) + "\n\n")  # and an empty line, which is no record and no warning
    db.append(rec(tile=3))
    with pytest.warns(UserWarning) as caught:
        again = TuningDatabase(path)
    messages = [str(w.message) for w in caught]
    assert len(messages) == len(bad_lines)
    for lineno, message in enumerate(messages, start=2):
        assert f"{path}:{lineno}: skipped a corrupt tuning record" in message
    assert "['times_ms']" in messages[4] and "records-99" in messages[5]
    assert [r.candidate["knobs"]["tile"] for r in again.records()] == [1, 3]


def test_truncated_last_line_is_skipped_and_the_next_append_is_valid(tmp_path):
    path = tmp_path / "db.jsonl"
    db = TuningDatabase(path)
    db.append(rec(tile=1))
    half = rec(tile=2).to_json()
    with open(path, "a") as f:  # what a kill during a write leaves: half a line, no newline
        f.write(half[: len(half) // 2])
    with pytest.warns(UserWarning, match=r"db.jsonl:2: skipped"):
        db = TuningDatabase(path)
    assert len(db) == 1
    db.append(rec(tile=3))
    with pytest.warns(UserWarning, match=r"db.jsonl:2: skipped"):
        again = TuningDatabase(path)
    assert [r.candidate["knobs"]["tile"] for r in again.records()] == [1, 3]
    db.append(rec(tile=4))  # no partial line now: no newline added, no new warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(TuningDatabase(path)) == 3
    assert len(caught) == 1


# schedules/database.py needs only the standard library: loaded alone, without the package
# (and TVM), the writer starts in a fraction of a second
WRITER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("database", sys.argv[2])
database = sys.modules["database"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(database)
TuningDatabase, TuningRecord = database.TuningDatabase, database.TuningRecord
db = TuningDatabase(sys.argv[1])
print("ready", flush=True)
i = 0
while True:
    db.append(TuningRecord("t0", "llvm", {"i": i, "pad": "x" * 2000}, [1.0 + i % 7], kernel="k"))
    i += 1
"""


def test_a_writer_killed_with_sigkill_leaves_a_loadable_file(tmp_path):
    path = tmp_path / "db.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(path), database.__file__],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        deadline = time.time() + 20
        while (not path.exists() or path.stat().st_size < 200_000) and time.time() < deadline:
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = TuningDatabase(path)
    assert len(caught) <= 1  # at most the line being written when the kill came
    assert len(db) >= 90
    assert [r.candidate["i"] for r in db.records()] == list(range(len(db)))
    db.append(TuningRecord("t0", "llvm", {"i": -1}, [1.0]))
    assert TuningDatabase(path).records()[-1].candidate == {"i": -1}
