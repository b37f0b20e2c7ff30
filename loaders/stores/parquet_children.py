"""Columns of large local parquet files read in child processes, so that their footers are parsed side by side.

Parsing a parquet footer holds the interpreter: threads parse the footers of several files one after another
(measured here: four 25k-row-group footers, 2.2 s in one thread, 2.0 s in two), while processes parse them at
once. A child also keeps what the parse leaves (hundreds of MB of metadata at a million episodes) out of the
training process. :func:`read_columns` starts a fresh interpreter per share of the files (``python -m`` this
module: it imports numpy and pyarrow, nothing of mmfeed's readers, and does not import the caller's ``__main__``
as a forked or spawned multiprocessing child would), each child writes every file's columns as an Arrow IPC file,
and the caller maps those. A child that fails for any reason (an unreadable file, no interpreter to start) makes
:func:`read_columns` return None: the caller reads in its own process, where the error names the file as
usual. Run as a script::

    python -m mmfeed.loaders.stores.parquet_children JOB.json

where JOB.json is ``{"columns": [...], "files": [[parquet path, output path], ...]}``; each output holds the
columns of ``columns`` the file has, one chunk each where Arrow can combine them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["read_columns"]

log = logging.getLogger(__name__)


def read_columns(paths: Sequence[str], columns: Sequence[str], *, processes: int | None = None
                 ) -> list[pa.Table] | None:
    """The ``columns`` each of the local parquet files ``paths`` has (those it lacks are left out: the caller
    names them), one table per file in order, read by ``processes`` child processes (default: one per CPU, at
    most one per file); None when a child failed (the caller then reads the files itself)."""
    if not paths:
        return []
    processes = max(1, min(len(paths), processes or os.cpu_count() or 1))
    work = tempfile.mkdtemp(prefix="mmfeed-parquet-")
    try:
        outputs = [os.path.join(work, f"{k}.arrow") for k in range(len(paths))]
        shares = _shares([os.path.getsize(p) for p in paths], processes)
        children = []
        for n, share in enumerate(shares):
            job = os.path.join(work, f"job-{n}.json")
            with open(job, "w") as f:
                json.dump({"columns": list(columns), "files": [[paths[k], outputs[k]] for k in share]}, f)
            children.append(subprocess.Popen([sys.executable, "-m", __name__, job], stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        failed = False
        for child in children:  # read each one's errors to the end while it runs: a full pipe would block it
            errors = child.communicate()[1]
            if child.returncode:
                failed = True
                log.debug("reading parquet columns in a child process failed (read here instead): %s",
                          errors.decode(errors="replace")[-2000:])
        if failed or not all(os.path.exists(o) for o in outputs):
            return None
        return [pa.ipc.open_file(pa.memory_map(o)).read_all() for o in outputs]
    except OSError:  # no interpreter to start, no room for the outputs
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the tables keep their maps of the removed files


def _shares(sizes: Sequence[int], processes: int) -> list[list[int]]:
    """The files dealt to ``processes`` children, largest first to the least loaded, each share in file order."""
    loads, shares = [0] * processes, [[] for _ in range(processes)]
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        least = loads.index(min(loads))
        loads[least] += sizes[k]
        shares[least].append(k)
    return [sorted(s) for s in shares if s]


def _write(path: str, columns: Sequence[str], out: str) -> None:
    parquet = pq.ParquetFile(pa.OSFile(path))
    present = set(parquet.schema_arrow.names)
    table = parquet.read(columns=[c for c in columns if c in present], use_threads=False)
    try:  # one chunk a column instead of one a row group: the caller combines them otherwise
        table = table.combine_chunks()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # dictionaries that differ between row groups, say
        pass
    with pa.ipc.new_file(out + ".part", table.schema) as writer:
        writer.write_table(table)
    os.replace(out + ".part", out)


def main(argv: Sequence[str] | None = None) -> int:
    (job,) = sys.argv[1:] if argv is None else argv
    with open(job) as f:
        spec = json.load(f)
    for path, out in spec["files"]:
        _write(path, spec["columns"], out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
