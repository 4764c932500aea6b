// Endpoint and TransportKind parsing (declared in fabric/transport.h).
#include <charconv>

#include "fabric/transport.h"

namespace tessera::fabric {

std::string_view TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kAuto: return "auto";
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kRdma: return "rdma";
  }
  return "unknown";
}

Result<TransportKind> ParseTransportKind(std::string_view name) {
  if (name == "auto") return TransportKind::kAuto;
  if (name == "tcp") return TransportKind::kTcp;
  if (name == "rdma") return TransportKind::kRdma;
  return InvalidArgument("unknown transport '", name, "' (want auto, tcp or rdma)");
}

std::string Endpoint::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Result<Endpoint> ParseEndpoint(std::string_view text) {
  if (text.empty()) return InvalidArgument("empty endpoint (want HOST:PORT)");
  std::string_view host;
  std::string_view port;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return InvalidArgument("endpoint '", text, "': missing ']' after an IPv6 address");
    }
    host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument("endpoint '", text, "': want [ADDR]:PORT");
    }
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return InvalidArgument("endpoint '", text, "': missing ':PORT'");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return InvalidArgument("endpoint '", text, "': write IPv6 addresses as [ADDR]:PORT");
    }
  }
  if (host.empty()) return InvalidArgument("endpoint '", text, "': empty host");
  if (host.size() > 253) return InvalidArgument("endpoint '", text, "': host name too long");
  for (char c : host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == ':' || c == '_' || c == '%';
    if (!ok) return InvalidArgument("endpoint '", text, "': bad character in host");
  }
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || value == 0 ||
      value > 65535) {
    return InvalidArgument("endpoint '", text, "': port must be a number in 1..65535");
  }
  return Endpoint{std::string(host), static_cast<uint16_t>(value)};
}

}  // namespace tessera::fabric
