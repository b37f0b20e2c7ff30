"""Child processes for tests that leave nothing running: each command runs in a process group of its own, and
everything it started (DataLoader workers, torchrun's ranks) is killed when the command ends, times out or the
test is interrupted while it runs.

A process group is not enough: torchrun starts each rank in a session of its own, so a rank outlives a torchrun
killed on a timeout, and two ranks spinning in a collective that never completes would take this machine's two
cores from every later test. So the command's descendants are found from ``/proc`` (each process's parent)
before anything is killed, and killed one by one beside the group."""

import os
import signal
import subprocess


def run(cmd, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` run to its end with its output captured as text (``kwargs`` go to Popen: env, cwd); on a timeout
    (``subprocess.TimeoutExpired``) or an interrupt the command and all its descendants are killed first."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)  # whatever the command left behind goes with it
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def descendants(pid: int) -> list[int]:
    """The pids of the processes below ``pid`` (children, their children, ...), read from ``/proc`` (Linux;
    elsewhere none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(b")", 1)[1].split()[1])  # after the name, which may hold spaces: state, ppid
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc``'s descendants (in whatever session they are) and its process group (it was started in
    a session of its own), then reap ``proc``."""
    for _ in range(2):  # a second pass for what was started while the first one ran
        for pid in descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
