# Usage: fill_verify.py MIB [FIFO]. Fills MIB MiB with pages whose bytes depend on their index,
# prints "filled", waits for a line on FIFO (a named pipe the test writes once it has killed
# memservers; without FIFO: stdin), then reads every page back and prints a digest.
# Under a memory cgroup limit well below N MiB most pages are in swap while it waits.
import hashlib
import sys

mib = int(sys.argv[1])
pages = mib * 256
buf = bytearray(pages * 4096)
for i in range(pages):
    buf[i * 4096:i * 4096 + 16] = i.to_bytes(8, "little") * 2
    buf[i * 4096 + 2048] = i % 251
print("filled", flush=True)
if len(sys.argv) > 2:
    with open(sys.argv[2]) as fifo:
        fifo.readline()
else:
    sys.stdin.readline()
h = hashlib.sha256()
for i in range(pages):
    h.update(buf[i * 4096:i * 4096 + 16])
    h.update(bytes([buf[i * 4096 + 2048]]))
print("digest", h.hexdigest(), flush=True)
