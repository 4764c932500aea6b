/* An operator's offload library, used by the Kayak tests: one well-behaved read-only function,
 * one read-write function, and functions that misbehave in every way the runtime must contain. */
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "apps/kayak/server/tessera_offload.h"

/* 300 sum: args = n 8-byte keys; result = 8-byte sum of the first 8 bytes of each found value. */
static int Sum(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
               uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  uint64_t sum = 0;
  uint8_t buf[256];
  for (uint32_t off = 0; off + 8 <= args_len; off += 8) {
    uint32_t len = 0;
    int rc = api->get(kv, args + off, 8, buf, sizeof(buf), &len);
    if (rc == TESSERA_OFFLOAD_OK && len >= 8) {
      uint64_t v;
      memcpy(&v, buf, 8);
      sum += v;
    }
  }
  if (out_cap < 8) return 7;
  memcpy(out, &sum, 8);
  *out_len = 8;
  return TESSERA_OFFLOAD_OK;
}

/* 301 add: args = key (8 bytes) + delta (8 bytes); adds delta to the u64 value (absent = 0). */
static int Add(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
               uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  if (args_len != 16 || out_cap < 8) return 9;
  uint64_t v = 0, delta;
  uint32_t len = 0;
  uint8_t buf[8];
  if (api->get(kv, args, 8, buf, sizeof(buf), &len) == TESSERA_OFFLOAD_OK && len == 8) {
    memcpy(&v, buf, 8);
  }
  memcpy(&delta, args + 8, 8);
  v += delta;
  memcpy(buf, &v, 8);
  api->put(kv, args, 8, buf, 8);
  memcpy(out, &v, 8);
  *out_len = 8;
  return TESSERA_OFFLOAD_OK;
}

/* 302: loops forever without ever calling the runtime. */
static int SpinForever(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
                       uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  (void)api; (void)kv; (void)args; (void)args_len; (void)out; (void)out_cap; (void)out_len;
  volatile uint64_t x = 0;
  for (;;) x++;
  return 0;
}

/* 303: loops forever, yielding and writing (the writes must never land). */
static int SpinYielding(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
                        uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  (void)args; (void)args_len; (void)out; (void)out_cap; (void)out_len;
  const uint8_t key[8] = {'s', 'p', 'i', 'n', 0, 0, 0, 0};
  for (;;) {
    api->put(kv, key, 8, key, 8);
    api->yield(kv);
  }
  return 0;
}

/* 304: dereferences a wild pointer. */
static int Segfault(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
                    uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  (void)api; (void)kv; (void)out; (void)out_cap; (void)out_len;
  volatile uint8_t* volatile p = (volatile uint8_t*)(uintptr_t)(16 + args_len * 0);
  (void)args;
  return p[0];
}

/* 305: asks the handle for a key far out of range. */
static int BadHandleCall(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
                         uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  (void)args; (void)args_len; (void)out; (void)out_cap; (void)out_len;
  uint8_t key[8] = {0};
  uint32_t len;
  return api->get(kv, key, 100000, out, out_cap, &len);
}

/* 306: hands the handle a wild buffer pointer. */
static int WildBuffer(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
                      uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  (void)out; (void)out_cap; (void)out_len; (void)args_len;
  uint32_t len;
  return api->get(kv, args, 8, (uint8_t*)(uintptr_t)64, 4096, &len);
}

/* 307: args = 8-byte nanoseconds; stays off the CPU that long (in nanosleep), then returns OK
 * with no result. It stands in for a worker that waits for a CPU on a busy machine, which must
 * not use up the function's budget (CPU time); real functions must not make system calls. */
static int OffCpu(const tessera_offload_api* api, tessera_kv* kv, const uint8_t* args,
                  uint32_t args_len, uint8_t* out, uint32_t out_cap, uint32_t* out_len) {
  (void)api; (void)kv; (void)out; (void)out_cap;
  if (args_len != 8) return 9;
  uint64_t ns;
  memcpy(&ns, args, 8);
  struct timespec left = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&left, &left) != 0) {
  }
  *out_len = 0;
  return TESSERA_OFFLOAD_OK;
}

static const tessera_offload_function kFunctions[] = {
    {300, "sum", Sum},
    {301, "add", Add},
    {302, "spin_forever", SpinForever},
    {303, "spin_yielding", SpinYielding},
    {304, "segfault", Segfault},
    {305, "bad_handle_call", BadHandleCall},
    {306, "wild_buffer", WildBuffer},
    {307, "off_cpu", OffCpu},
};

const tessera_offload_function* tessera_offload_functions(uint32_t* count) {
  *count = sizeof(kFunctions) / sizeof(kFunctions[0]);
  return kFunctions;
}
