/* tessera_offload.h: the C ABI of operators' offload functions for Tessera memory servers.
 *
 * An operator writes functions that run on a memserver's CPU next to its KV tables, builds them
 * into a shared library and names it on the memserver's command line:
 *
 *     tessera memserver --offload_lib /path/libmyfuncs.so [--offload_lib ...]
 *
 * Libraries are loaded once at start-up, never from the network. Each library exports
 *
 *     const tessera_offload_function* tessera_offload_functions(uint32_t* count);
 *
 * returning an array of `*count` functions that stays valid for the life of the process. Ids
 * must be >= TESSERA_OFFLOAD_FIRST_USER_ID (lower ids are the built-in functions) and unique
 * across all libraries; a clash stops the memserver at start-up with an error.
 *
 * A client calls a function with KV_INVOKE(table, function id, argument bytes); the server runs
 * it on its bounded worker pool and replies with the bytes it wrote to `out`.
 *
 * What a function may do, and nothing else:
 *   - read and write the table it is given, only through `api` and the `kv` handle:
 *       api->get(kv, key, key_len, buf, buf_cap, &value_len)
 *           TESSERA_OFFLOAD_OK and the value copied into buf (value_len set) when found;
 *           TESSERA_OFFLOAD_NOT_FOUND when absent; TESSERA_OFFLOAD_TOO_SMALL (value_len set to
 *           the size needed, nothing copied) when buf_cap is too small.
 *       api->put(kv, key, key_len, value, value_len)  -> TESSERA_OFFLOAD_OK
 *       api->del(kv, key, key_len)                    -> TESSERA_OFFLOAD_OK or _NOT_FOUND
 *     Keys are 1..64 bytes, values 0..65536 bytes.
 *   - yield: api->yield(kv) between steps of long work (a chance for the runtime to stop it).
 *   - compute on its own stack and on the argument and output buffers it is given.
 * It must not allocate, block, take locks, make system calls, keep state between calls or
 * touch memory other than the above.
 *
 * Writes are transactional: a function sees its own writes, and they are applied to the table
 * all at once when it returns TESSERA_OFFLOAD_OK, only if no key it read has changed meanwhile
 * (optimistic concurrency); otherwise the runtime runs it again (so a function must be a pure
 * function of its arguments and what it reads). A function that fails or is stopped writes
 * nothing.
 *
 * Misbehaviour is contained, reported to the caller as an error, and the server keeps serving:
 *   - running past the time budget (memserver --offload_budget: CPU time of the worker thread),
 *     in a loop with or without yields: the function is stopped (the worker thread jumps out
 *     of it);
 *   - a bad handle call (key or value length out of range, a NULL buffer, out_len > out_cap):
 *     the function is stopped at that call;
 *   - a memory fault (SIGSEGV/SIGBUS) in the function's own code: the function is stopped.
 *   Wild writes into valid server memory cannot be detected by an in-process runtime: load only
 *   libraries you trust as much as the memserver itself.
 *
 * Return TESSERA_OFFLOAD_OK with *out_len <= out_cap, or any other value for an application
 * error (reported to the caller with that code; nothing is written).
 */
#ifndef TESSERA_OFFLOAD_H_
#define TESSERA_OFFLOAD_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TESSERA_OFFLOAD_ABI_VERSION 1
#define TESSERA_OFFLOAD_FIRST_USER_ID 256

#define TESSERA_OFFLOAD_OK 0
#define TESSERA_OFFLOAD_NOT_FOUND 1
#define TESSERA_OFFLOAD_TOO_SMALL 2

typedef struct tessera_kv tessera_kv; /* Opaque: the table (and transaction) of this call. */

typedef struct tessera_offload_api {
  uint32_t abi_version; /* TESSERA_OFFLOAD_ABI_VERSION */
  int (*get)(tessera_kv* kv, const uint8_t* key, uint32_t key_len, uint8_t* buf, uint32_t buf_cap,
             uint32_t* value_len);
  int (*put)(tessera_kv* kv, const uint8_t* key, uint32_t key_len, const uint8_t* value,
             uint32_t value_len);
  int (*del)(tessera_kv* kv, const uint8_t* key, uint32_t key_len);
  void (*yield)(tessera_kv* kv);
} tessera_offload_api;

typedef int (*tessera_offload_fn)(const tessera_offload_api* api, tessera_kv* kv,
                                  const uint8_t* args, uint32_t args_len, uint8_t* out,
                                  uint32_t out_cap, uint32_t* out_len);

typedef struct tessera_offload_function {
  uint32_t id;      /* >= TESSERA_OFFLOAD_FIRST_USER_ID */
  const char* name; /* For logs and STATS. */
  tessera_offload_fn fn;
} tessera_offload_function;

/* The one symbol a library exports. */
typedef const tessera_offload_function* (*tessera_offload_functions_fn)(uint32_t* count);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_OFFLOAD_H_ */
