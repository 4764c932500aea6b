// A JVM program for `tessera run`: fills a HashMap of N arrays of 64 longs (about 55 MB for
// N = 100000 at -Xmx128m), reads it back three times, prints a digest line, then its RssAnon.
// Run it with the source-file launcher: java -Xmx128m HeapWorkload.java N
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;

public class HeapWorkload {
  public static void main(String[] args) throws Exception {
    int n = Integer.parseInt(args[0]);
    HashMap<Integer, long[]> m = new HashMap<>();
    for (int i = 0; i < n; i++) {
      long[] v = new long[64];
      for (int j = 0; j < 64; j++) v[j] = (long) i * 31 + j;
      m.put(i, v);
    }
    long sum = 0;
    for (int r = 0; r < 3; r++) {
      for (int i = 0; i < n; i++) sum += m.get(i)[(i + r) % 64];
    }
    System.out.println("heap-workload: entries " + m.size() + " sum " + sum);
    for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
      if (line.startsWith("RssAnon:")) System.out.println("rss-anon-kb " + line.replaceAll("[^0-9]", ""));
    }
  }
}
