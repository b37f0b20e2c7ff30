"""The test harness's child processes (tests/procs.py) leave nothing running, whatever session a descendant is in."""

import os
import subprocess
import sys
import time

import pytest

import procs

# a child that starts a grandchild in a session of its own (as torchrun starts its ranks), prints its pid, and
# waits for ever; the grandchild waits for ever too
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_timed_out_command_is_killed_with_descendants_in_other_sessions(tmp_path):
    out = tmp_path / "out"
    with open(out, "w") as sink:  # the grandchild's pid, where the test can read it after the timeout
        proc = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True, stdout=sink)
        deadline = time.monotonic() + 30
        while not out.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(out.read_text())
        assert os.getsid(grandchild) != os.getsid(proc.pid) and procs.descendants(proc.pid) == [grandchild]
        procs.kill_group(proc)
    assert proc.returncode == -9 and not _alive(grandchild)
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        procs.run([sys.executable, "-c", PARENT], timeout=3)
    printed = timed_out.value.stdout  # what the command printed before its timeout: the grandchild's pid
    assert printed and not _alive(int(printed.decode() if isinstance(printed, bytes) else printed))
