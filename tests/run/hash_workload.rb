# A Ruby program for `tessera run` (Ruby's mark-and-sweep GC keeps its object heap in pages it
# maps itself): builds a Hash of N strings and arrays, runs the GC, walks it, prints a digest
# line and then its RssAnon. Usage: ruby hash_workload.rb N
n = Integer(ARGV[0] || 200_000)
h = {}
n.times { |i| h["k#{i}"] = ["v" * 24 + i.to_s, i, i * 3] }
(0...n).step(3) { |i| h.delete("k#{i}") }
GC.start
sum = 0
h.each { |k, v| sum += v[1] + v[2] + v[0].length + k.length }
puts "hash-workload: entries #{h.size} sum #{sum}"
anon = File.read("/proc/self/status")[/RssAnon:\s+(\d+)/, 1]
puts "rss-anon-kb #{anon}" if anon
