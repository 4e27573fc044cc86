"""What to know when the test run ends without pytest's summary (run by `make unit` then).

A local Ray whose raylet or GCS dies takes the pytest process with it (Ray's driver exits
with status 1 and prints nothing), so the usual report never comes. This prints what the
next person needs instead: the test that was running, the disk and memory left, and the
error lines of the newest Ray sessions' logs.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import time

# Written by tests/conftest.py as each test starts: one file, or one per pytest-xdist worker
# (ingest-test-current-gw0, ...).
CURRENT = os.path.join(tempfile.gettempdir(), "ingest-test-current")
# Ray's log lines at level E (error) or F (fatal), and the words of a dying process.
PATTERN = re.compile(r"^\[[^\]]* [EF] \d+ \d+\]|Check failed|out of memory|No space left")
LOGS = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err", "python-core-driver-*")


def main() -> None:
    print("\n=== why the test run ended (scripts/why_tests_died.py) ===")
    for path in sorted(glob.glob(CURRENT) + glob.glob(CURRENT + "-*")):
        worker = path[len(CURRENT) + 1 :]
        when = time.strftime("%H:%M:%S", time.localtime(os.path.getmtime(path)))
        with open(path) as f:
            on = f" on {worker}" if worker else ""
            print(f"last test started{on} (at {when}): {f.read().strip()}")
    for path in (os.getcwd(), tempfile.gettempdir()):
        usage = shutil.disk_usage(path)
        print(f"disk {path}: {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f}")
    with open("/proc/meminfo") as f:
        print(
            " ".join(
                line.split(":")[0] + line.split(":")[1].strip()
                for line in f
                if line.startswith(("MemTotal", "MemAvailable"))
            )
        )
    sessions = sorted(
        glob.glob(os.path.join(tempfile.gettempdir(), "ray", "session_2*")), key=os.path.getmtime
    )
    for session in sessions[-3:]:
        for pattern in LOGS:
            for path in sorted(glob.glob(os.path.join(session, "logs", pattern))):
                with open(path, errors="replace") as f:
                    hits = [line.rstrip() for line in f if PATTERN.search(line)]
                if hits:
                    print(f"--- {path}: last {min(len(hits), 15)} of {len(hits)} error lines")
                    print("\n".join(line[:400] for line in hits[-15:]))
    # The kernel's word on killed processes, where this user may read it.
    try:
        dmesg = subprocess.run(["dmesg"], check=False, capture_output=True, text=True, timeout=10)
        killed = [x for x in dmesg.stdout.splitlines() if "Killed process" in x or "oom" in x]
        print("\n".join(killed[-10:]) or "dmesg: no killed processes")
    except (OSError, subprocess.SubprocessError) as e:
        print(f"dmesg: {e}")


if __name__ == "__main__":
    main()
