"""A soak run of the loader against a flaky HTTP server (run by hand: ``python tests/soak.py [--epochs 10]``):
epochs of a packed loader with 2 persistent workers over shards served from 127.0.0.1, one shard request in
``--fault-every`` answering 500 or dropping the connection half way; prints RSS (loop + workers), shared-memory
entries and open file descriptors before and after, faults served, and whether every epoch held exactly the
samples of its plan (nothing lost, nothing repeated)."""

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dist_job import packing  # noqa: E402
from http_server import serve  # noqa: E402
from mmfeed import DataLoader  # noqa: E402
from mmfeed.loaders import open_dataset  # noqa: E402
from mmfeed.testing import make_episodes, write_webdataset  # noqa: E402


def snapshot() -> dict:
    pids = [os.getpid()] + [p.pid for p in multiprocessing.active_children()]
    rss = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            rss += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {"processes": len(pids), "rss_mib": round(rss / 1024, 1), "shm_entries": len(os.listdir("/dev/shm")),
            "open_fds": len(os.listdir(f"/proc/{os.getpid()}/fd"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--fault-every", type=int, default=10, help="1 in N shard requests fails (default 10%%)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mmfeed-soak-"))
    write_webdataset(root / "d", make_episodes(12, seed=11, min_length=20, max_length=60, cameras=("cam_high",),
                                               height=48, width=64), episodes_per_shard=3)
    count = {"n": 0}

    def fault(number, path):
        if not path.endswith(".tar"):
            return None
        count["n"] += 1
        return ("500", "drop")[count["n"] // args.fault_every % 2] if count["n"] % args.fault_every == 0 else None

    os.environ["MMFEED_REMOTE_BLOCK_BYTES"] = "65536"  # small blocks and a small cache: every epoch reads again
    os.environ["MMFEED_REMOTE_CACHE_BYTES"] = str(256 << 10)
    with serve(root, fault=fault) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/d/mmfeed-index.parquet"
        ds = open_dataset(url, cache_episodes=1)  # workers keep one episode: every epoch fetches again
        loader = DataLoader(ds, packing=packing(), num_workers=2, persistent_workers=True)
        report = {"before": None, "epochs": []}
        start = time.monotonic()
        for epoch in range(args.epochs):
            seen = [s for b in loader for s in b.metadata["sample"].tolist()]
            plan = loader.dataset.plan(epoch)
            planned = sorted(set(range(len(plan.tokens))) - set(plan.dropped.tolist()))
            if report["before"] is None:
                report["before"] = snapshot()
            report["epochs"].append({"epoch": epoch, "batches_ok": sorted(seen) == planned,
                                     "samples": len(seen), "repeats": len(seen) - len(set(seen))})
        report["after"] = snapshot()
        report["faults"] = {kind: sum(1 for k, _ in server.faults if k == kind) for kind in ("500", "drop")}
        report["requests_answered"] = len(server.served)
        report["seconds"] = round(time.monotonic() - start, 1)
    report["all_epochs_exact"] = all(e["batches_ok"] and not e["repeats"] for e in report["epochs"])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
