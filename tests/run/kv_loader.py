#!/usr/bin/env python3
"""Loads a deterministic dataset into redis or memcached, then reads every key back.

Usage: kv_loader.py redis|memcached PORT KEYS [VALUE_BYTES]
Prints "kv-loader: half" (flushed) once half of the keys are stored, so a test can kill
memservers at that point, and at the end "kv-loader: verified N digest HEX" if every value
read back equals what was written (exit 1 and the first bad key otherwise). The values depend
only on the key index, so the digest is the same for every correct run.
"""
import hashlib
import socket
import sys


def value(i, size):
    seed = hashlib.sha256(b"%d" % i).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise SystemExit("kv-loader: connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise SystemExit("kv-loader: connection closed")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data


def main():
    kind, port, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 400
    c = Conn(port)
    batch = 500
    for start in range(0, keys, batch):
        end = min(keys, start + batch)
        out = []
        for i in range(start, end):
            k = b"key:%08d" % i
            v = value(i, size)
            if kind == "redis":
                out.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
            else:
                out.append(b"set %s 0 0 %d\r\n%s\r\n" % (k, len(v), v))
        c.send(b"".join(out))
        for i in range(start, end):
            reply = c.line()
            if reply not in (b"+OK", b"STORED"):
                raise SystemExit("kv-loader: set key %d: %r" % (i, reply))
        if start < keys // 2 <= end:
            print("kv-loader: half", flush=True)
    h = hashlib.sha256()
    for start in range(0, keys, batch):
        end = min(keys, start + batch)
        out = []
        for i in range(start, end):
            k = b"key:%08d" % i
            out.append(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k) if kind == "redis"
                       else b"get %s\r\n" % k)
        c.send(b"".join(out))
        for i in range(start, end):
            head = c.line()
            if kind == "redis":
                if not head.startswith(b"$") or int(head[1:]) < 0:
                    raise SystemExit("kv-loader: key %d missing: %r" % (i, head))
                v = c.exact(int(head[1:]) + 2)[:-2]
            else:
                parts = head.split()
                if len(parts) != 4 or parts[0] != b"VALUE":
                    raise SystemExit("kv-loader: key %d missing: %r" % (i, head))
                v = c.exact(int(parts[3]) + 2)[:-2]
                if c.line() != b"END":
                    raise SystemExit("kv-loader: key %d: no END" % i)
            if v != value(i, size):
                raise SystemExit("kv-loader: key %d has wrong bytes" % i)
            h.update(v)
    print("kv-loader: verified %d digest %s" % (keys, h.hexdigest()), flush=True)


if __name__ == "__main__":
    main()
