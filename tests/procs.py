"""Child processes for tests that leave nothing running: each command runs in a process group of its own, and the
whole group (the command and everything it started: DataLoader workers, torchrun's ranks) is killed when the
command ends, times out or the test is interrupted while it runs."""

import os
import signal
import subprocess


def run(cmd, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` run to its end with its output captured as text (``kwargs`` go to Popen: env, cwd); on a timeout
    (``subprocess.TimeoutExpired``) or an interrupt the command's whole process group is killed first."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)  # whatever the command left behind in its group goes with it
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``'s process group (it was started in a session of its own) and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
