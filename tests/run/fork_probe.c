// tessera-fork-probe: forks with a large heap and checks the bytes in both processes.
// Usage: tessera-fork-probe MB
// Fills MB of heap (1 MB blocks) with a first pattern and forks. The parent then rewrites its
// whole heap with a second pattern (paged, those writes go back to the store while the child
// lives) and only then lets the child go on. The child checks that it still has the first
// pattern everywhere, rewrites a quarter with a third pattern, frees another quarter and
// calloc()s it back (zeros), and checks it all again. The parent checks the second pattern
// after the child exited. Prints "fork-probe: ok" when both saw exactly their own bytes.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK (1u << 20)
#define WORDS (BLOCK / sizeof(uint64_t))

static uint64_t Word(size_t block, size_t i, uint64_t round) {
  return ((uint64_t)block << 32 | i) * 0x9e3779b97f4a7c15ull ^ round * 0xbf58476d1ce4e5b9ull;
}
static void Fill(uint64_t* b, size_t block, uint64_t round) {
  for (size_t i = 0; i < WORDS; ++i) b[i] = Word(block, i, round);
}
static size_t Wrong(const uint64_t* b, size_t block, uint64_t round) {
  size_t n = 0;
  for (size_t i = 0; i < WORDS; ++i) n += b[i] != Word(block, i, round);
  return n;
}

int main(int argc, char** argv) {
  const size_t mb = argc > 1 ? (size_t)atoi(argv[1]) : 64;
  if (mb < 4) return 2;
  uint64_t** blocks = malloc(mb * sizeof *blocks);
  if (blocks == NULL) return 2;
  for (size_t b = 0; b < mb; ++b) {
    blocks[b] = malloc(BLOCK);
    if (blocks[b] == NULL) return 2;
    Fill(blocks[b], b, 1);
  }
  int go[2];
  if (pipe(go) != 0) return 2;
  fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    perror("fork-probe: fork");
    return 2;
  }
  if (pid == 0) {
    char c;
    if (read(go[0], &c, 1) != 1) _exit(3);
    size_t wrong = 0;
    for (size_t b = 0; b < mb; ++b) wrong += Wrong(blocks[b], b, 1);  // The heap of the fork.
    for (size_t b = 0; b < mb / 4; ++b) Fill(blocks[b], b, 3);      // Its own writes ...
    for (size_t b = mb / 4; b < mb / 2; ++b) {                      // ... frees, allocations.
      free(blocks[b]);
      blocks[b] = calloc(1, BLOCK);
      if (blocks[b] == NULL) _exit(4);
      for (size_t i = 0; i < WORDS; ++i) wrong += blocks[b][i] != 0;
    }
    for (size_t b = 0; b < mb / 4; ++b) wrong += Wrong(blocks[b], b, 3);
    for (size_t b = mb / 2; b < mb; ++b) wrong += Wrong(blocks[b], b, 1);
    printf("fork-probe child: %zu MB checked, %zu wrong words\n", mb, wrong);
    fflush(stdout);
    _exit(wrong == 0 ? 0 : 1);
  }
  for (size_t b = 0; b < mb; ++b) Fill(blocks[b], b, 2);
  if (write(go[1], "x", 1) != 1) return 2;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return 2;
  size_t wrong = 0;
  for (size_t b = 0; b < mb; ++b) wrong += Wrong(blocks[b], b, 2);
  const int child = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  printf("fork-probe parent: %zu MB checked, %zu wrong words; child exit %d\n", mb, wrong, child);
  const int ok = wrong == 0 && child == 0;
  printf("fork-probe: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
