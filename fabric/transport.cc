// Transport::Create: the run-time choice between the verbs and the TCP transport.
#include "common/logging.h"
#include "fabric/transport.h"

namespace tessera::fabric {

Result<std::unique_ptr<Transport>> Transport::Create(const TransportOptions& options) {
  switch (options.kind) {
    case TransportKind::kTcp:
      return CreateTcpTransport(options);
    case TransportKind::kRdma: {
      Status probe = ProbeRdma();
      if (!probe.ok()) {
        return Unsupported("transport 'rdma' requested but unusable: ", probe.message());
      }
      return CreateRdmaTransport(options);
    }
    case TransportKind::kAuto: {
      Status probe = ProbeRdma();
      if (probe.ok()) {
        auto t = CreateRdmaTransport(options);
        if (t.ok()) return t;
        TLOG(WARNING) << "RDMA device present but the verbs transport failed ("
                      << t.status().message() << "); using TCP";
      } else {
        TLOG(DEBUG) << "transport auto: " << probe.message() << "; using TCP";
      }
      return CreateTcpTransport(options);
    }
  }
  return InvalidArgument("unknown transport kind");
}

}  // namespace tessera::fabric
