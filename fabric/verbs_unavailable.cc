// The RDMA entry points of a build without rdma-core (TESSERA_RDMA=OFF, or libibverbs-dev /
// librdmacm-dev absent at configure): every one says the build has no verbs, so
// `--transport=auto` stays on TCP, and `--transport=rdma` fails with that reason.
#include <memory>
#include <string>

#include "common/status.h"
#include "fabric/transport.h"
#include "fabric/verbs.h"

namespace tessera::fabric {
namespace {

Status BuiltWithoutVerbs() {
  return Unsupported("this build of Tessera has no RDMA verbs transport (configured without "
                     "rdma-core: install libibverbs-dev and librdmacm-dev and reconfigure)");
}

}  // namespace

Status ProbeRdma() { return BuiltWithoutVerbs(); }

Result<std::unique_ptr<VerbsListener>> VerbsListener::Create(const std::string& /*host*/,
                                                             uint16_t /*port*/) {
  return BuiltWithoutVerbs();
}

Result<std::unique_ptr<Transport>> CreateRdmaTransport(const TransportOptions& /*options*/) {
  return BuiltWithoutVerbs();
}

}  // namespace tessera::fabric
