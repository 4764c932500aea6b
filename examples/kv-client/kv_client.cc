// kv_client CLUSTER_FILE CREDENTIAL_FILE KEY VALUE
//
// Puts VALUE under KEY in KV table 1 of the memory servers listed in CLUSTER_FILE, reads it
// back, and prints "KEY = VALUE (version N)". Exit 0 when the value read back is the one
// written, 1 otherwise.
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#include "apps/kayak/client/client.h"
#include "fabric/cluster_file.h"
#include "fabric/credential.h"

namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

int Fail(const char* what, const tessera::Status& st) {
  std::fprintf(stderr, "kv_client: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: kv_client CLUSTER_FILE CREDENTIAL_FILE KEY VALUE\n");
    return 2;
  }
  const std::string key = argv[3], value = argv[4];

  auto members = tessera::fabric::LoadClusterFile(argv[1]);
  if (!members.ok()) return Fail("cluster file", members.status());
  auto credential = tessera::fabric::LoadCredential(argv[2], "kv_client");
  if (!credential.ok()) return Fail("credential", credential.status());

  kayak::ClientOptions options;
  for (const auto& m : *members) options.servers.push_back(m.endpoint);
  options.secret = credential->key;
  options.client_id = credential->client_id;  // 0 for the cluster secret: a random id.
  options.table = 1;
  auto client = kayak::Client::Connect(options);
  if (!client.ok()) return Fail("connect", client.status());

  auto version = (*client)->Put(Bytes(key), Bytes(value));
  if (!version.ok()) return Fail("put", version.status());
  auto got = (*client)->Get(Bytes(key));
  if (!got.ok()) return Fail("get", got.status());

  const std::string read_back(got->bytes.begin(), got->bytes.end());
  std::printf("%s = %s (version %llu)\n", key.c_str(), read_back.c_str(),
              static_cast<unsigned long long>(got->version));
  return read_back == value && got->version == *version ? 0 : 1;
}
