"""benchmarks.profile_compare: the engine core's profiles side by side, by function (pure logic, made-up stacks)."""

from __future__ import annotations

import pytest

from benchmarks.profile_compare import compare, main

RAW = """thread (1): MainThread;main (e.py:1);busy_loop (core.py:5);step (core.py:9);schedule (s.py:3) 200
thread (1): MainThread;main (e.py:1);busy_loop (core.py:5);step (core.py:9);execute (m.py:7) 400
thread (1): MainThread;main (e.py:1);busy_loop (core.py:6);step (core.py:9);execute (m.py:8) 100
thread (2): Thread-2 (process_input_sockets);main (e.py:1);recv (z.py:2) 300
"""
FLOW = """thread (1): MainThread;main (e.py:1);busy_loop (core.py:5);step (core.py:9);schedule (s.py:3) 300
thread (1): MainThread;main (e.py:1);busy_loop (core.py:5);step (core.py:9);execute (m.py:7) 500
thread (2): Thread-2 (process_input_sockets);main (e.py:1);recv (z.py:2) 900
"""


def test_the_functions_that_differ_most_come_first_and_a_chain_of_callers_is_one_row():
    lines = compare({"raw": RAW, "flow": FLOW}, rate=100)
    assert lines[0] == "| seconds, MainThread and what it called | raw | flow |"
    assert lines[2] == "| the thread, active | 7.00 | 8.00 |"  # Thread-2's samples are another thread's
    rows = {line.split("`")[1]: line.rsplit("|", 3)[1:3] for line in lines[3:]}
    # by how much they differ (a second each, then none; the deeper first where alike); main, busy_loop and step
    # have the same seconds in both: step, the deepest, stands for them; a function's lines are one function
    assert list(rows) == ["schedule (s.py)", "step (core.py)", "execute (m.py)"]
    assert rows["execute (m.py)"] == [" 5.00 ", " 5.00 "] and rows["schedule (s.py)"] == [" 2.00 ", " 3.00 "]
    assert rows["step (core.py)"] == [" 7.00 ", " 8.00 "]
    assert list(compare({"raw": RAW, "flow": FLOW}, rate=100, top=1)[3:]) == [lines[3]]
    input_thread = compare({"raw": RAW, "flow": FLOW}, thread="Thread-2 (process_input_sockets)", rate=100)
    assert input_thread[2] == "| the thread, active | 3.00 | 9.00 |" and "`recv (z.py)` | 3.00 | 9.00 |" in input_thread[3]


def test_the_command_reads_a_folder_of_profiles_and_stops_with_exit_2_on_a_missing_one(tmp_path, capsys):
    (tmp_path / "8x16-repeat1-raw.txt").write_text(RAW)
    (tmp_path / "8x16-repeat1-default.txt").write_text(FLOW)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| seconds, MainThread and what it called | 8x16-repeat1-default | 8x16-repeat1-raw |")
    assert "| the thread, active | 4.00 | 3.50 |" in out  # 200 samples a second, --profile-engine-core's rate
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "nothing.txt")])
    assert stopped.value.code == 2 and "nothing.txt" in capsys.readouterr().err
