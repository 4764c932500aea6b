"""A script interpreter with a large hash table: builds a dict of N string keys with small
tuple values, then makes N random lookups and prints a digest line. Usage:
python3 hashtable.py N"""
import random
import sys

n = int(sys.argv[1])
rng = random.Random(42)
table = {}
for i in range(n):
    table["key-%d-%08x" % (i, rng.getrandbits(32))] = (i, "v" * (i % 17))
keys = list(table)
acc = 0
for _ in range(n):
    i, s = table[keys[rng.randrange(n)]]
    acc = (acc * 31 + i + len(s)) & 0xFFFFFFFFFFFFFFFF
print("tessera-hashtable: keys %d digest %016x" % (len(table), acc))
