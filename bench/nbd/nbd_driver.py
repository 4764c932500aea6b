# The client side of `tessera bench nbd`: a libnbd (python3-libnbd) program that runs the same
# 4 KB workloads against any NBD URI and prints one JSON object per workload. Embedded into the
# bench binary at build time (bench_nbd_main.cc writes it to a temporary file and runs it with
# the distribution's python3), so both exports are measured by one client, in one way.
#
#   python3 nbd_driver.py --uri URI --pages N --prefill
#   python3 nbd_driver.py --uri URI --pages N --ops N --qd Q --seed S
#
# Every page p holds pack('<Q', p) * 512 (written by --prefill and by every write workload), so
# every read is checked byte for byte; wrong bytes are counted as mismatches.
import argparse
import json
import random
import struct
import sys
import time

import nbd

PAGE = 4096


def content(p):
    return struct.pack('<Q', p) * (PAGE // 8)


def pct(sorted_ns, q):
    if not sorted_ns:
        return 0.0
    i = min(len(sorted_ns) - 1, int(q * len(sorted_ns)))
    return sorted_ns[i] / 1000.0


def qd1(h, kind, pages):
    lat = []
    mism = 0
    t0 = time.perf_counter_ns()
    for p in pages:
        if kind == 'read':
            s = time.perf_counter_ns()
            buf = h.pread(PAGE, p * PAGE)
            lat.append(time.perf_counter_ns() - s)
            if buf != content(p):
                mism += 1
        else:
            data = content(p)
            s = time.perf_counter_ns()
            h.pwrite(data, p * PAGE)
            lat.append(time.perf_counter_ns() - s)
    return lat, time.perf_counter_ns() - t0, mism


def qdn(h, kind, pages, qd):
    lat = []
    mism = 0
    inflight = {}  # cookie -> (page, start_ns, buffer)
    i = 0
    t0 = time.perf_counter_ns()
    while i < len(pages) or inflight:
        while i < len(pages) and len(inflight) < qd:
            p = pages[i]
            i += 1
            if kind == 'read':
                buf = nbd.Buffer(PAGE)
                s = time.perf_counter_ns()
                c = h.aio_pread(buf, p * PAGE)
            else:
                buf = nbd.Buffer.from_bytearray(bytearray(content(p)))
                s = time.perf_counter_ns()
                c = h.aio_pwrite(buf, p * PAGE)
            inflight[c] = (p, s, buf)
        h.poll(-1)
        for c in list(inflight):
            if not h.aio_command_completed(c):  # Raises on an error reply.
                continue
            p, s, buf = inflight.pop(c)
            lat.append(time.perf_counter_ns() - s)
            if kind == 'read' and bytes(buf.to_bytearray()) != content(p):
                mism += 1
    return lat, time.perf_counter_ns() - t0, mism


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--uri', required=True)
    ap.add_argument('--pages', type=int, required=True)
    ap.add_argument('--ops', type=int, default=2000)
    ap.add_argument('--qd', type=int, default=16)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--prefill', action='store_true')
    a = ap.parse_args()
    h = nbd.NBD()
    h.connect_uri(a.uri)
    if h.get_size() < a.pages * PAGE:
        sys.exit('export of %d bytes is smaller than %d pages' % (h.get_size(), a.pages))
    if a.prefill:
        chunk = 256
        for base in range(0, a.pages, chunk):
            n = min(chunk, a.pages - base)
            h.pwrite(b''.join(content(p) for p in range(base, base + n)), base * PAGE)
        h.flush()
        print(json.dumps({'prefilled_pages': a.pages}))
        return
    rng = random.Random(a.seed)
    start = rng.randrange(a.pages)
    seq = [(start + i) % a.pages for i in range(a.ops)]
    rnd = [rng.randrange(a.pages) for _ in range(a.ops)]
    for pattern, pages in (('seq', seq), ('rand', rnd)):
        for kind in ('read', 'write'):
            for qd in (1, a.qd):
                if qd == 1:
                    lat, ns, mism = qd1(h, kind, pages)
                else:
                    lat, ns, mism = qdn(h, kind, pages, qd)
                lat.sort()
                print(json.dumps({
                    'workload': '%s-%s-4k' % (pattern, kind), 'qd': qd, 'ops': len(lat),
                    'p50_us': pct(lat, 0.50), 'p99_us': pct(lat, 0.99),
                    'ops_per_s': len(lat) / (ns / 1e9), 'mismatches': mism}))
                sys.stdout.flush()
    h.shutdown()


if __name__ == '__main__':
    main()
