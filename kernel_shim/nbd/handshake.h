// Internal to the NBD export: the fixed newstyle handshake (option haggling) of one
// connection, as nbdkit's server/protocol-handshake*.c: greeting, client flags, then options
// until NBD_OPT_GO / NBD_OPT_EXPORT_NAME picks an export (or the client aborts or misbehaves).
// Options: GO, INFO, LIST, ABORT, STRUCTURED_REPLY, EXPORT_NAME; others get NBD_REP_ERR_UNSUP.
// Bounded by options.handshake_timeout_ms (SO_RCVTIMEO, cleared again on success).
//
// Threads: the connection's reader thread; `options` must outlive the call and the result
// (the export pointer points into options.exports).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernel_shim/nbd/nbd_server.h"

namespace tessera::nbd {

// What the handshake agreed on.
struct Negotiated {
  const ExportSpec* exp = nullptr;  // Into options.exports.
  bool structured = false;          // NBD_OPT_STRUCTURED_REPLY was negotiated.
  uint16_t trans_flags = 0;         // The transmission flags sent to the client.
};

// Runs the handshake on `fd` (a connected stream socket); nullopt when the connection is to be
// closed (abort, unknown export by EXPORT_NAME, bad magic or flags, oversized option, the
// client vanished or timed out), with a logged reason where the client misbehaved.
std::optional<Negotiated> NegotiateHandshake(int fd, const NbdServerOptions& options,
                                             const std::string& peer);

// The export named `name`; "" is the default export (the first one) unless an export has that
// name. nullptr when there is none.
const ExportSpec* FindExport(const NbdServerOptions& options, const std::string& name);

}  // namespace tessera::nbd
