// tessera-static-probe: a statically linked program (no program interpreter, so LD_PRELOAD
// never reaches it). `tessera run` must say that it cannot page it and run it unpaged.
// Usage: tessera-static-probe MB: fills and checks MB of heap, prints a checksum line.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  const size_t mb = argc > 1 ? (size_t)atoi(argv[1]) : 16;
  const size_t words = mb << 17;
  uint64_t* p = malloc(words * sizeof(uint64_t));
  if (p == NULL) return 1;
  for (size_t i = 0; i < words; ++i) p[i] = i * 0x9e3779b97f4a7c15ull;
  uint64_t sum = 0;
  for (size_t i = 0; i < words; ++i) sum += p[i] ^ (i >> 3);
  free(p);
  printf("static-probe: %zu MB checksum %016llx\n", mb, (unsigned long long)sum);
  return 0;
}
