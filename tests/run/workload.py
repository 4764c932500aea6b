#!/usr/bin/env python3
"""A data-structure-heavy workload for `tessera run` tests and the demo.

An in-memory external sort, the shape of many batch jobs: it builds CHUNKS chunks of records
(dicts of tuples, lists and strings), keeps all of them alive, then sorts and rewrites each
chunk in turn, and finally merges the sorted chunks (heapq.merge, one cursor per chunk) into
grouped totals. Everything stays in memory, so at 50% local memory half of the heap is remote
while each phase works through it chunk by chunk. It prints a SHA-256 digest of everything
it computed; the digest depends only on the arguments, so a paged run must print exactly what
an unpaged run prints. After building it prints "tessera-workload: half" (flushed) so a test
can kill memservers at that point.

Usage: workload.py [RECORDS] [CHUNKS] [SEED]
(RECORDS=400000 uses about 150 MB in CPython 3.11.)
"""
import hashlib
import heapq
import random
import sys
import gc


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400000
    chunks = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    # A batch job: no reference cycles, so the cyclic GC (which scans the whole heap) is off.
    gc.disable()
    rng = random.Random(seed)
    h = hashlib.sha256()
    per = max(1, n // chunks)
    data = []
    for c in range(chunks):
        table = {}
        for i in range(per):
            key = "k%09d-%d-%d" % (rng.randrange(10**9), c, i)
            table[key] = [c * per + i, rng.random(), [rng.randrange(1000) for _ in range(6)], key[::-1]]
        data.append(table)
    print("tessera-workload: half", flush=True)
    runs = []
    for c in range(chunks):
        table = data[c]
        for rec in table.values():
            rec[2].append(sum(rec[2]) % 997)
            rec[1] = round(rec[1] * rec[2][-1], 9)
        # The sorted run is rebuilt as fresh, compact records and the chunk is dropped.
        items = [(k.encode(), b"%d %.9f %s" % (v[0], v[1], " ".join(map(str, v[2])).encode()))
                 for k, v in sorted(table.items())]
        data[c] = None
        del table
        h.update(b"%d %s %s %d\n" % (c, items[0][0], items[-1][0], len(items)))
        runs.append(items)
    groups = {}
    prev = None
    for key, packed in heapq.merge(*runs):
        if prev is not None and key <= prev:
            raise SystemExit("merge out of order")
        prev = key
        fields = packed.split()
        first, last = int(fields[2]), int(fields[-1])
        g = first % 101
        t = groups.get(g, (0, 0.0))
        groups[g] = (t[0] + int(fields[0]) + last, round(t[1] + float(fields[1]), 6))
    for g in sorted(groups):
        h.update(("%d %d %.6f\n" % (g, groups[g][0], groups[g][1])).encode())
    print("tessera-workload: records %d digest %s" % (chunks * per, h.hexdigest()), flush=True)


if __name__ == "__main__":
    main()
