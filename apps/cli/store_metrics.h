// Prometheus text for the clients of the page store (tessera nbd's --metrics-port): the
// store's counters, its read and write latencies as histograms, ratios in 0..1, and the
// build's version. Served with memserver::MetricsHttpServer, the memory server's endpoint.
//
// Threads: pure functions of their arguments; any thread.
#pragma once

#include <string>

#include "client/page_store.h"

namespace tessera::cli {

// `tessera_build_info{component="...",version="...",commit="..."} 1`, with HELP and TYPE.
std::string BuildInfoMetrics(const std::string& component);

// Every metric of one store, named tessera_client_*, labelled store="<name>".
std::string StoreMetrics(const std::string& store_name, const client::PageStoreStats& s);

}  // namespace tessera::cli
