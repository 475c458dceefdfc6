"""What a header at safetensors' 100,000,000-byte limit costs to read: loadkit, the safetensors
library and Python's ``json.loads``, side by side.

    python benchmarks/hostile_headers.py            # every case, 3 runs each (median)
    python benchmarks/hostile_headers.py --runs 1 --case arrays

Each case is a file under data/big/hostile/ (ignored by git) whose header is (nearly) 100 MB:

- ``tensors``: about a million ordinary entries (a legitimate, if absurd, header);
- ``arrays``: one tensor whose unknown field holds 33 million empty arrays (issue 13's example:
  Python's json builds 2.4 GiB of lists);
- ``metadata``: 6 million ``__metadata__`` pairs;
- ``shape``: one tensor whose shape lists 50 million ones;
- ``top-array``: a header that is an array of 33 million empty arrays, not an object.

Every reader runs in its own process, alternating, and reports its verdict, seconds and peak
resident memory beyond a bare interpreter (its ``VmHWM`` minus the same process without the
read), as one JSON line per case and reader.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "big" / "hostile"
LIMIT = 100_000_000
ENTRY = '"dtype":"F32","shape":[1],"data_offsets":[{},{}]'

READERS = {
    "loadkit": (
        "from loadkit.checkpoint.reader import read_safetensors_header as read\n"
        "from loadkit.errors import LoadkitError as Refused\n"
    ),
    "safetensors": (
        "from safetensors import safe_open\n"
        "from safetensors import SafetensorError as Refused\n"
        "def read(path):\n"
        "    with safe_open(path, 'np') as f:\n"
        "        return f.keys()\n"
    ),
    "json.loads": (
        "import json\n"
        "Refused = (ValueError, RecursionError)\n"
        "def read(path):\n"
        "    with open(path, 'rb') as f:\n"
        "        n = int.from_bytes(f.read(8), 'little')\n"
        "        return json.loads(f.read(n))\n"
    ),
}

# Peak memory is VmHWM, this process's own high-water mark: ru_maxrss would start at the parent's
# (Linux carries it across exec), and this parent holds a 100 MB header while writing the files.
RUN = """
import sys, time
{setup}
start = time.perf_counter()
try:
    if sys.argv[2] == "read":
        read(sys.argv[1])
    verdict = "accepted"
except Refused:
    verdict = "refused"
seconds = time.perf_counter() - start
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(verdict, seconds, hwm.split()[1])
"""


def _write(path: Path, header: str, data: int) -> Path:
    blob = header.encode()
    blob += b" " * (-len(blob) % 8)
    assert len(blob) <= LIMIT, len(blob)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + bytes(data))
    return path


def make(case: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{case}.safetensors"
    if path.exists():
        return path
    one = '{"w":{' + ENTRY.format(0, 4)
    if case == "tensors":
        parts, size, i = [], 2, 0
        while True:
            name = f"model.layers.{i // 10}.mlp.proj{i % 10}.weight"
            part = f'"{name}":{{{ENTRY.format(4 * i, 4 * i + 4)}}}'
            if size + len(part) + 1 > LIMIT - 8:
                break
            parts.append(part)
            size += len(part) + 1
            i += 1
        return _write(path, "{" + ",".join(parts) + "}", 4 * i)
    if case == "arrays":
        n = (LIMIT - len(one) - 16) // 3
        return _write(path, one + ',"x":[' + ",".join(["[]"] * n) + "]}}", 4)
    if case == "metadata":
        n = (LIMIT - 100) // 16
        pairs = ",".join(f'"k{i:08d}":"v"' for i in range(n))
        return _write(path, '{"__metadata__":{' + pairs + "}," + one[1:] + "}}", 4)
    if case == "shape":
        n = (LIMIT - 100) // 2
        header = '{"w":{"dtype":"F32","data_offsets":[0,4],"shape":[' + ",".join(["1"] * n) + "]}}"
        return _write(path, header, 4)
    if case == "top-array":
        return _write(path, "[" + ",".join(["[]"] * ((LIMIT - 8) // 3)) + "]", 0)
    raise ValueError(case)


CASES = ("tensors", "arrays", "metadata", "shape", "top-array")


def run(reader: str, path: Path, what: str) -> tuple[str, float, int]:
    code = RUN.format(setup=READERS[reader])
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), what],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    return out[0], float(out[1]), int(out[2]) * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--case", choices=CASES, action="append")
    args = parser.parse_args()
    for case in args.case or CASES:
        path = make(case)
        header = int.from_bytes(path.open("rb").read(8), "little")
        results: dict[str, list[tuple[str, float, int]]] = {r: [] for r in READERS}
        bases = {r: run(r, path, "none")[2] for r in READERS}
        for _ in range(args.runs):
            for reader in READERS:
                results[reader].append(run(reader, path, "read"))
        for reader, rows in results.items():
            peak = statistics.median(r[2] for r in rows) - bases[reader]
            line = {
                "case": case,
                "header_bytes": header,
                "reader": reader,
                "verdict": rows[0][0],
                "seconds": round(statistics.median(r[1] for r in rows), 2),
                "peak_mib": round(peak / 2**20),
                "peak_per_header_byte": round(peak / header, 2),
            }
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
