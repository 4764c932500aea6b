// NbdServer: serves byte ranges of a PageStore as Network Block Device exports, so any NBD
// client (the kernel's nbd.ko through nbd-client, qemu, libnbd tools) can use the resilient
// page store as a block device, e.g. as swap.
//
// Protocol (kernel_shim/nbd/protocol.h): fixed newstyle handshake with NO_ZEROES; options
// NBD_OPT_GO, NBD_OPT_INFO (NBD_INFO_EXPORT, NAME, DESCRIPTION, BLOCK_SIZE min 1 / preferred
// 4096 / max max_payload), NBD_OPT_LIST, NBD_OPT_ABORT, NBD_OPT_STRUCTURED_REPLY and the old
// NBD_OPT_EXPORT_NAME; every other option gets NBD_REP_ERR_UNSUP. Commands READ, WRITE (+FUA),
// FLUSH, TRIM, WRITE_ZEROES (+NO_HOLE, +FUA) and DISC. Transmission flags: HAS_FLAGS,
// SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES, CAN_MULTI_CONN, and SEND_DF when
// structured replies were negotiated (a read is always answered in one data chunk).
//
// CAN_MULTI_CONN is safe here: every connection of every export goes to the one PageStore in
// this process, a reply to a write is sent only after the store acknowledged all of its pages,
// and FLUSH on any connection calls PageStore::Flush(), which covers every write the store
// acknowledged before the call, whichever connection sent it.
//
// Requests: each connection has a reader thread (handshake, then request headers and write
// payloads; it starts READs itself) and a completion thread (read-modify-write steps,
// TRIM/FLUSH, errors and retries). With direct_reads and a store that offers a ThreadReader
// (client/page_store.h; the remote erasure-coded layouts), the reader thread reads the pages
// of a READ on its own Transport, straight from the servers holding them, keeps many READs in
// flight, and between requests polls their replies and answers the READs it completed (no
// thread hop at all); pages it cannot read directly (being written, server failed or slow, CRC
// mismatch) go to the store's threads. Otherwise READs are Submit()ted to the store. A READ or
// a plain WRITE whose page ops all succeed is answered by the thread that completed its last
// op (the reader, or a store thread), with a non-blocking send (no thread hop on the fast
// path); what the socket cannot take at once is queued and written by the completion thread,
// so a slow client never blocks a store thread. Many requests are in flight per connection
// and are answered in the order they complete. Requests that are not 4 KB aligned are served by read-modify-write of the edge pages. Every request
// that changes data (WRITE, TRIM, WRITE_ZEROES) holds an asynchronous lock on each page it
// touches (taken in ascending page order, so no deadlock), across all connections and exports
// of the server, so two unaligned writes into one page never lose each other's bytes.
//
// Bad input: a bad request magic, a WRITE longer than max_payload (its payload cannot be
// skipped safely) or a client that vanishes closes the connection after the requests already
// accepted have completed; out-of-range requests get NBD_EINVAL (reads, trims) or NBD_ENOSPC
// (writes, write-zeroes), unknown commands or flags NBD_EINVAL, a READ longer than max_payload
// NBD_EINVAL. Nothing outside an export's page range is ever submitted to the store.
//
// Threads: Listen*/Start/Shutdown from one controlling thread; ServeConnection from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/page_store.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera::nbd {

struct ExportSpec {
  std::string name;         // Unique; "" is allowed and is also the default export.
  std::string description;  // Sent as NBD_INFO_DESCRIPTION and in NBD_OPT_LIST.
  uint64_t size_bytes = 0;  // Any size > 0; the last page may be partly used.
  client::PageId first_page = 0;  // The export's bytes start at this page of the store.
};

struct NbdServerOptions {
  std::vector<ExportSpec> exports;  // At least one; page ranges must not overlap.
  // Largest READ/WRITE/TRIM/WRITE_ZEROES payload accepted (advertised as the maximum block
  // size). 32 MiB by default, like qemu-nbd.
  uint32_t max_payload = 32u << 20;
  // Back-pressure per connection: the reader stops reading requests while this many are in
  // flight or this many payload bytes are buffered.
  uint32_t max_inflight_requests = 256;
  uint64_t max_inflight_bytes = 256ull << 20;
  // Bound on the handshake (a client that connects and says nothing is dropped).
  uint32_t handshake_timeout_ms = 30000;
  // A client that does not take a reply within this long is disconnected.
  uint32_t send_timeout_ms = 60000;
  // Run-to-completion READs: each connection's reader thread reads the pages of its READs
  // itself, with a PageStore::NewThreadReader of its own (many reads in flight, completions
  // polled between requests), when the store has one (the remote erasure-coded layouts with
  // direct reads); what it cannot read directly goes to the store's threads as before. False, or a
  // store without such a reader: READs are Submit()ted to the store's threads.
  bool direct_reads = true;
  // With direct reads in flight and no request waiting, the reader polls for replies and
  // requests for twice the time replies recently took, at most this long (0..1000 us; 0: never
  // polls), before it sleeps (the next reply or request wakes it); if replies took longer, it
  // sleeps at once. Like RemoteStoreOptions::direct_spin_us.
  uint32_t direct_spin_us = 100;
  // Called (from any connection's threads, concurrently) before each request that changes data
  // (WRITE, TRIM, WRITE_ZEROES) reaches the store; an error fails that request with NBD_EIO
  // and nothing of it is stored. `tessera nbd --state_file` records there, durably, that this
  // run changes data (kernel_shim/nbd/export_state.h). Empty: nothing is called.
  std::function<Status()> before_change;
};

struct NbdServerStats {
  uint64_t connections = 0;
  uint64_t requests = 0;
  uint64_t errors_replied = 0;  // Requests answered with an NBD error.
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t rmw_pages = 0;       // Edge pages served by read-modify-write.
  uint64_t trimmed_pages = 0;
  uint64_t retried_ops = 0;     // Page ops resubmitted after failing with Unavailable.
};

class NbdServer {
 public:
  // `store` must outlive the server. InvalidArgument for an empty or bad export list (a
  // duplicate name, a range beyond the store, overlapping ranges).
  static Result<std::unique_ptr<NbdServer>> Create(client::PageStore* store,
                                                   NbdServerOptions options);
  ~NbdServer();  // Shutdown().
  NbdServer(const NbdServer&) = delete;
  NbdServer& operator=(const NbdServer&) = delete;

  // Binds a listening socket; returns the port actually bound (port 0 = ephemeral).
  Result<uint16_t> ListenTcp(const std::string& host, uint16_t port);
  Status ListenUnix(const std::string& path);
  // Starts the accept thread over every listening socket.
  Status Start();

  // Serves one already connected stream socket (handshake + transmission) on new threads;
  // the server owns the fd from now on. For tests (socketpair) and for Start()'s acceptor.
  void ServeConnection(UniqueFd fd);

  // Stops accepting, closes every connection after its accepted requests complete, and
  // flushes the store. Idempotent.
  Status Shutdown();

  // Connections currently open.
  size_t active_connections() const;
  NbdServerStats Stats() const;
  const NbdServerOptions& options() const { return options_; }

  struct Connection;
  struct Shared;

 private:
  NbdServer(client::PageStore* store, NbdServerOptions options);
  void AcceptLoop();

  client::PageStore* store_;
  NbdServerOptions options_;
  std::unique_ptr<Shared> shared_;
  std::vector<UniqueFd> listeners_;
  std::vector<std::string> unix_paths_;
  UniqueFd wake_fd_;  // eventfd that stops the acceptor.
  std::thread acceptor_;
  std::atomic<bool> shut_down_{false};
};

// Lays exports (name, size in bytes) out back to back in one store, each starting on a page
// boundary; sets *total_pages to the store pages they need together.
std::vector<ExportSpec> LayOutExports(const std::vector<std::pair<std::string, uint64_t>>& sizes,
                                      uint64_t* total_pages);

}  // namespace tessera::nbd
