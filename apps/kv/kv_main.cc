// `tessera kv`: KV tables and offload functions on Tessera memservers, for people and scripts.
#include <gflags/gflags.h>

#include <algorithm>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "apps/kayak/client/client.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "apps/cli/membership_cli.h"
#include "fabric/cluster_file.h"
#include "apps/kayak/wire/builtins.h"

DEFINE_string(cluster, "", "Cluster file listing the memservers (or --etcd)");
DEFINE_string(etcd, "",
              "etcd endpoints (HOST:PORT,...): use the servers registered in --cluster_name, "
              "in endpoint order (instead of --cluster)");
DEFINE_string(cluster_name, "", "Cluster registered in etcd (with --etcd)");
DEFINE_string(auth_token_file, "", "Credential file (`tessera token issue`) or the cluster secret (empty: the development default)");
DEFINE_uint32(table, 1, "Table id (non-zero)");
DEFINE_uint32(replicas, 1, "Replicas of every key: 1 = none, n = n-way replication");
DEFINE_string(mode, "kayak", "How invoke runs built-in functions: kv, rpc, pushback or kayak");
DEFINE_string(key_format, "text", "text (the key's bytes) or u64 (an integer as 8 LE bytes)");
DEFINE_string(value_format, "text",
              "text, hex, or chain (put KEY NEXT [COUNTER]: a chained value of --value_size "
              "bytes whose first 8 bytes name NEXT, bytes 8..15 a counter)");
DEFINE_uint32(value_size, 100, "Bytes of a chain value");
DEFINE_bool(json, false, "Print one JSON object instead of text");
DEFINE_int32(timeout_ms, 10000, "A request with no reply after this fails with Timeout (> 0)");

namespace {

using tessera::cli::CliSpec;
using tessera::cli::UsageError;
namespace bi = tessera::kayak::builtins;

const CliSpec kSpec = {
    "tessera kv",
    "--cluster FILE | --etcd ENDPOINTS --cluster_name NAME  [--auth_token_file F] [--table N] [--replicas R] [--mode M] "
    "get KEY | put KEY VALUE | del KEY | invoke FUNCTION ARGS...",
    "Reads and writes a KV table sharded over the memservers of a cluster file, and invokes\n"
    "offload functions next to the data. Functions: chase START HOPS, chase_compute START HOPS\n"
    "ITERS, aggregate KEY..., chase_increment START HOPS (built-ins; keys are integers), or a\n"
    "numeric id of an operator's function: ID ROUTING_KEY [ARGS_HEX]. Exit 0 on success, 1 on\n"
    "an error (e.g. a missing key: 'not found'), 2 on bad usage.",
    __FILE__, 2, -1};

std::vector<uint8_t> ParseKey(const std::string& s) {
  if (FLAGS_key_format == "u64") {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    if (errno != 0 || end == s.c_str() || *end != 0) UsageError(kSpec, "not an integer key: " + s);
    return bi::KeyBytes(v);
  }
  if (s.empty() || s.size() > 64) UsageError(kSpec, "a key is 1..64 bytes: '" + s + "'");
  return std::vector<uint8_t>(s.begin(), s.end());
}

uint64_t ParseU64(const std::string& s, const char* what) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str() || *end != 0) {
    UsageError(kSpec, std::string(what) + " must be an integer, got '" + s + "'");
  }
  return v;
}

std::vector<uint8_t> ParseHex(const std::string& s) {
  if (s.size() % 2 != 0) UsageError(kSpec, "hex needs an even number of digits");
  std::vector<uint8_t> out;
  for (size_t i = 0; i < s.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string Hex(std::span<const uint8_t> b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t c : b) {
    s.push_back(d[c >> 4]);
    s.push_back(d[c & 15]);
  }
  return s;
}

std::string Printable(std::span<const uint8_t> b) {
  for (uint8_t c : b) {
    if (c < 0x20 || c > 0x7e) return "0x" + Hex(b);
  }
  return std::string(b.begin(), b.end());
}

int Fail(const tessera::Status& s) {
  if (FLAGS_json) {
    nlohmann::json j = {{"ok", false}, {"error", s.ToString()}};
    std::cout << j.dump() << "\n";
  } else {
    std::fprintf(stderr, "tessera kv: %s\n", s.ToString().c_str());
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_cluster.empty() && FLAGS_etcd.empty()) {
    UsageError(kSpec, "--cluster FILE or --etcd ENDPOINTS --cluster_name NAME is required");
  }
  if (FLAGS_key_format != "text" && FLAGS_key_format != "u64") {
    UsageError(kSpec, "--key_format must be text or u64");
  }
  auto mode = kayak::ParseMode(FLAGS_mode);
  if (!mode.ok()) UsageError(kSpec, "--mode: " + mode.status().message());
  if (FLAGS_table == 0) UsageError(kSpec, "--table must be non-zero");
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string cmd = args[0];

  auto source = tessera::cli::ResolveCluster(FLAGS_cluster, FLAGS_etcd, FLAGS_cluster_name);
  if (!source.ok() && source.status().code() == tessera::StatusCode::kInvalidArgument) {
    UsageError(kSpec, source.status().message());
  }
  if (!source.ok()) return Fail(source.status());
  // Tables are sharded over the server list, so it must be the same list every time: etcd's
  // registrations are taken in endpoint order (a join or leave changes the sharding).
  std::vector<tessera::fabric::Endpoint> endpoints;
  for (const auto& srv : source->servers) endpoints.push_back(srv.endpoint);
  if (source->from_etcd()) {
    std::sort(endpoints.begin(), endpoints.end(), [](const auto& a, const auto& b) {
      return a.host != b.host ? a.host < b.host : a.port < b.port;
    });
  }
  auto cred = tessera::fabric::LoadCredential(FLAGS_auth_token_file, "tessera kv");
  if (!cred.ok()) return Fail(cred.status());
  kayak::ClientOptions o;
  o.servers = endpoints;
  o.secret = cred->key;
  o.client_id = cred->client_id;  // 0 (the cluster secret): a random id.
  o.table = FLAGS_table;
  o.replicas = FLAGS_replicas;
  o.controller.mode = *mode;
  o.measure_rtt = false;
  if (FLAGS_timeout_ms <= 0) UsageError(kSpec, "--timeout_ms must be positive");
  o.request_timeout_ms = FLAGS_timeout_ms;
  if (o.replicas == 0 || o.replicas > o.servers.size()) {
    UsageError(kSpec, "--replicas must be in 1.." + std::to_string(o.servers.size()));
  }

  // Validate the command before connecting.
  auto need = [&](size_t n, size_t max) {
    if (args.size() < n || args.size() > max) UsageError(kSpec, "wrong number of arguments for " + cmd);
  };
  if (cmd == "get" || cmd == "del") {
    need(2, 2);
  } else if (cmd == "put") {
    need(3, FLAGS_value_format == "chain" ? 4 : 3);
  } else if (cmd == "invoke") {
    need(2, 2 + bi::kMaxAggregateKeys);
  } else {
    UsageError(kSpec, "unknown command '" + cmd + "' (get, put, del, invoke)");
  }

  auto client = kayak::Client::Connect(o);
  if (!client.ok()) return Fail(client.status());
  kayak::Client& c = **client;
  nlohmann::json out = {{"ok", true}, {"command", cmd}};

  if (cmd == "get") {
    auto r = c.Get(ParseKey(args[1]));
    if (!r.ok()) return Fail(r.status());
    out["version"] = r->version;
    out["value"] = Printable(r->bytes);
    out["value_hex"] = Hex(r->bytes);
    if (!FLAGS_json) std::printf("%s\n", Printable(r->bytes).c_str());
  } else if (cmd == "put") {
    std::vector<uint8_t> value;
    if (FLAGS_value_format == "hex") {
      value = ParseHex(args[2]);
    } else if (FLAGS_value_format == "chain") {
      value.assign(std::max<uint32_t>(FLAGS_value_size, 16), 0x5a);
      bi::StoreLe64(value.data(), ParseU64(args[2], "NEXT"));
      bi::StoreLe64(value.data() + 8, args.size() > 3 ? ParseU64(args[3], "COUNTER") : 0);
    } else if (FLAGS_value_format == "text") {
      value.assign(args[2].begin(), args[2].end());
    } else {
      UsageError(kSpec, "--value_format must be text, hex or chain");
    }
    auto r = c.Put(ParseKey(args[1]), value);
    if (!r.ok()) return Fail(r.status());
    out["version"] = *r;
    if (!FLAGS_json) std::printf("OK version %llu\n", static_cast<unsigned long long>(*r));
  } else if (cmd == "del") {
    tessera::Status s = c.Delete(ParseKey(args[1]));
    if (!s.ok()) return Fail(s);
    if (!FLAGS_json) std::printf("OK\n");
  } else {
    const std::string& fn = args[1];
    tessera::Result<kayak::InvokeResult> r = tessera::InvalidArgument("unset");
    std::vector<uint8_t> fargs;
    uint32_t id = 0;
    if (fn == "chase" || fn == "chase_compute" || fn == "chase_increment") {
      id = fn == "chase" ? bi::kChase : fn == "chase_compute" ? bi::kChaseCompute : bi::kChaseIncrement;
      need(4, id == bi::kChaseCompute ? 5 : 4);
      bi::ChaseArgs a;
      a.start = ParseU64(args[2], "START");
      a.hops = static_cast<uint32_t>(ParseU64(args[3], "HOPS"));
      a.compute_iters = id == bi::kChaseCompute ? static_cast<uint32_t>(ParseU64(args[4], "ITERS")) : 0;
      fargs = a.Encode();
      r = c.Invoke(id, fargs);
    } else if (fn == "aggregate") {
      need(3, 2 + bi::kMaxAggregateKeys);
      bi::AggregateArgs a;
      for (size_t i = 2; i < args.size(); ++i) a.keys.push_back(ParseU64(args[i], "KEY"));
      fargs = a.Encode();
      id = bi::kMultiGetAggregate;
      r = c.Invoke(id, fargs);
    } else {
      id = static_cast<uint32_t>(ParseU64(fn, "FUNCTION"));
      need(3, 4);
      if (args.size() > 3) fargs = ParseHex(args[3]);
      r = c.InvokeOn(ParseKey(args[2]), id, fargs);
    }
    if (!r.ok()) return Fail(r.status());
    out["function"] = id;
    out["ran_as"] = r->rpc ? "rpc" : "kv";
    out["pushed_back"] = r->pushed_back;
    out["attempts"] = r->attempts;
    out["latency_us"] = r->latency_ns / 1000.0;
    out["result_hex"] = Hex(r->result);
    if (bi::IsBuiltin(id) && r->result.size() == bi::ChaseResult::kSize) {
      auto cr = bi::ChaseResult::Decode(r->result);
      out[id == bi::kMultiGetAggregate ? "found" : "last_key"] = cr->last_key;
      out[id == bi::kChaseIncrement ? "counter" : "digest"] = cr->value;
    }
    if (!FLAGS_json) {
      std::printf("%s (ran as %s%s, %u attempt%s, %.1f us)\n", Hex(r->result).c_str(),
                  r->rpc ? "rpc" : "kv", r->pushed_back ? " after pushback" : "", r->attempts,
                  r->attempts == 1 ? "" : "s", r->latency_ns / 1000.0);
    }
  }
  if (FLAGS_json) std::cout << out.dump() << "\n";
  return 0;
}
