// Prometheus text for the clients of the page store (the --metrics-port of tessera nbd, tessera
// swap and tessera paramsvc serve): the store's counters, its read and write latencies as
// histograms and ratios in 0..1, written with common/prometheus.h like the memory server's, and
// served with memserver::MetricsHttpServer, the memory server's endpoint. Build info comes
// from version::PrometheusBuildInfo.
//
// Threads: pure functions of their arguments; any thread.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "client/page_store.h"
#include "common/status.h"
#include "memserver/http_metrics.h"

namespace tessera::cli {

// Every metric of one store, named tessera_client_*, labelled store="<name>".
std::string StoreMetrics(const std::string& store_name, const client::PageStoreStats& s);

// A client's --metrics-port: serves tessera_build_info{component}, the metrics of `store` (none
// when null) and then `extra()` (a front end's own, may be empty) on host:port (0: ephemeral),
// and prints `metrics on HOST:PORT` on `announce` (stdout; `tessera run` uses stderr, since
// stdout is its program's). `store` and what `extra` reads must outlive the returned server;
// `extra` runs on the server's thread.
Result<std::unique_ptr<memserver::MetricsHttpServer>> ServeClientMetrics(
    const std::string& host, int port, const std::string& component, client::PageStore* store,
    std::function<std::string()> extra = nullptr, FILE* announce = stdout);

}  // namespace tessera::cli
