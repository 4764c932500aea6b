// libFuzzer target for the credential-file parser (fabric/credential.h): the input is the file's
// text. A parse must never crash, and whatever it accepts must be a consistent credential: a
// cluster secret of 16..4096 bytes, or a token whose name is valid, whose id is the name's and
// whose key is 32 bytes, and which formats and parses back to the same credential.
// Built with clang -fsanitize=fuzzer when TESSERA_FUZZ=ON; always built into
// fabric_credential_fuzz_test (a bounded run for CI, tests/support/fuzz_smoke.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fabric/credential.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::fabric;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = ParseCredential(text, "fuzz input");
  if (!c.ok()) {
    if (c.status().message().empty()) std::abort();  // Every refusal says why.
    return 0;
  }
  if (c->cluster_secret) {
    if (c->role != Role::kAdmin || c->key.size() < 16 || c->key.size() > 4096) std::abort();
    return 0;
  }
  if (!ValidateClientName(c->name).ok() || c->client_id != ClientIdForName(c->name) ||
      c->key.size() != 32) {
    std::abort();
  }
  auto again = ParseCredential(FormatCredential(*c), "formatted");
  if (!again.ok() || again->cluster_secret || again->role != c->role || again->name != c->name ||
      again->client_id != c->client_id || again->key != c->key) {
    std::abort();
  }
  return 0;
}
