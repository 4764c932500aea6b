// libFuzzer target for the cluster-file parser (fabric/cluster_file.h): the input is the file's
// text. A parse must never crash, and whatever it accepts must be well formed (a host, a port
// 1..65535, a valid or empty rack, no duplicate endpoint, ascending line numbers) and must read
// back the same when written out again one `HOST:PORT [rack=NAME]` line per server.
// Built with clang -fsanitize=fuzzer when TESSERA_FUZZ=ON; always built into
// fabric_cluster_file_fuzz_test (a bounded run for CI, tests/support/fuzz_smoke.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "fabric/cluster_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::fabric;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto members = ParseClusterFile(text, "fuzz input");
  if (!members.ok()) {
    if (members.status().message().empty()) std::abort();
    return 0;
  }
  std::set<std::string> seen;
  std::string out;
  int last_line = 0;
  for (const auto& m : *members) {
    if (m.endpoint.host.empty() || m.endpoint.port == 0 || m.rack.size() > 64 ||
        m.line <= last_line) {
      std::abort();
    }
    last_line = m.line;
    if (!seen.insert(m.endpoint.ToString()).second) std::abort();  // A duplicate was accepted.
    out += m.endpoint.ToString();
    if (!m.rack.empty()) out += " rack=" + m.rack;
    out += "\n";
  }
  auto again = ParseClusterFile(out, "formatted");
  if (!again.ok() || again->size() != members->size()) std::abort();
  for (size_t i = 0; i < again->size(); ++i) {
    if ((*again)[i].endpoint.ToString() != (*members)[i].endpoint.ToString() ||
        (*again)[i].rack != (*members)[i].rack) {
      std::abort();
    }
  }
  return 0;
}
