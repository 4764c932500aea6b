// A JavaScript program of the kind that used to crash under `tessera run`: it builds a Map of
// N small objects (V8's heap and node's malloc'ed memory grow together), walks it, and prints
// a digest line, then its RssAnon. Usage: node map_workload.js N
'use strict';
const n = Number(process.argv[2] || 200000);
const m = new Map();
for (let i = 0; i < n; i++) m.set('k' + i, {i, s: 'v'.repeat(24) + i, a: [i, i * 2, i * 3]});
let sum = 0n;
for (const [k, v] of m) sum += BigInt(v.i + v.s.length + v.a[2] + k.length);
for (let i = 0; i < n; i += 2) m.delete('k' + i);
let left = 0;
for (const v of m.values()) left += v.a[1];
console.log(`map-workload: entries ${n} digest ${sum} left ${m.size} ${left}`);
const status = require('fs').readFileSync('/proc/self/status', 'utf8');
const anon = /RssAnon:\s+(\d+)/.exec(status);
if (anon) console.log(`rss-anon-kb ${anon[1]}`);
