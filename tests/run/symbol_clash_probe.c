// tessera-symbol-clash-probe: a program that exports a function named like one of the
// libraries the paged program's pager uses, as node exports OpenSSL's gf_mul: the shim's
// erasure coder (ISA-L) must keep calling its own gf_mul, never this one.
//
// Usage: tessera-symbol-clash-probe MB. Fills MB of heap with a pattern (at 50% local memory,
// half of it is evicted, i.e. erasure-coded), reads it all back, prints a checksum line.
// Linked with -rdynamic, so gf_mul is in the executable's dynamic symbol table.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// OpenSSL's curve448 gf_mul has this shape: three pointers to field elements. Called with
// ISA-L's (unsigned char, unsigned char) it writes through a small integer (SIGSEGV).
void gf_mul(uint64_t* c, const uint64_t* a, const uint64_t* b) { c[0] = a[0] * b[0]; }

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s MB\n", argv[0]);
    return 2;
  }
  const size_t mb = (size_t)atoi(argv[1]);
  const size_t chunk = 1 << 20;
  uint64_t** blocks = malloc(mb * sizeof(uint64_t*));
  if (blocks == NULL) return 1;
  for (size_t i = 0; i < mb; ++i) {
    blocks[i] = malloc(chunk);
    if (blocks[i] == NULL) return 1;
    for (size_t j = 0; j < chunk / 8; ++j)
      blocks[i][j] = (i * 1000003u + j) * 0x9e3779b97f4a7c15ull;
  }
  uint64_t sum = 0;
  size_t bad = 0;
  for (size_t i = 0; i < mb; ++i) {
    for (size_t j = 0; j < chunk / 8; ++j) {
      const uint64_t want = (i * 1000003u + j) * 0x9e3779b97f4a7c15ull;
      bad += blocks[i][j] != want;
      sum += blocks[i][j];
    }
    free(blocks[i]);
  }
  free(blocks);
  printf("symbol-clash-probe: %zu MB checksum %016llx bad words %zu\n", mb, (unsigned long long)sum,
         bad);
  return bad == 0 ? 0 : 1;
}
