// `tessera token secret|issue|show`: make a cluster secret, issue per-client credentials from
// it, and show what a credential file holds (fabric/credential.h has the scheme and format).
#include <fcntl.h>
#include <gflags/gflags.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/cli/cli.h"
#include "fabric/auth.h"
#include "fabric/credential.h"

DEFINE_string(client, "", "issue: the client's name (1..64 of [A-Za-z0-9._@-]); its id is "
                          "derived from it");
DEFINE_bool(admin, false, "issue: an admin credential (any slab, fault injection, eviction)");
DEFINE_string(secret_file, "", "issue: the cluster secret file the memservers use "
                               "(their --auth_token_file)");
DEFINE_string(out, "", "secret/issue: write to this new file (mode 0600, never overwritten) "
                       "instead of stdout");
DEFINE_string(token_file, "", "show: the credential or secret file to describe");

namespace {

namespace fabric = tessera::fabric;
using tessera::cli::UsageError;

const tessera::cli::CliSpec kSpec = {
    "tessera token",
    "secret [--out F] | issue --client NAME --secret_file F [--admin] [--out F] | "
    "show --token_file F",
    "Credentials for a Tessera cluster. Every memserver holds the cluster secret\n"
    "(--auth_token_file); each client gets its own credential derived from it, which lets it\n"
    "act only as itself: it cannot read, write or free another client's slabs.\n"
    "  secret   print a fresh random cluster secret (64 hex digits)\n"
    "  issue    print the credential of client NAME: HMAC-SHA256(secret, its id), in the one-\n"
    "           line format clients read with --auth_token_file. --admin issues an admin\n"
    "           credential (the cluster secret itself is one too)\n"
    "  show     print, as JSON, what a credential file holds (role, name, id; never the key)",
    __FILE__, 1, 1};

int Fail(const std::string& what) {
  std::fprintf(stderr, "tessera token: %s\n", what.c_str());
  return 1;
}

// Writes `text` to stdout, or to a new file `path` created 0600 (refusing to overwrite).
int Emit(const std::string& text) {
  if (FLAGS_out.empty()) {
    std::fputs(text.c_str(), stdout);
    return std::fflush(stdout) == 0 ? 0 : Fail("writing stdout failed");
  }
  int fd = ::open(FLAGS_out.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Fail("cannot create '" + FLAGS_out + "': " + std::strerror(errno) +
                (errno == EEXIST ? " (refusing to overwrite a credential)" : ""));
  }
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return Fail("writing '" + FLAGS_out + "' failed: " + std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return Fail("closing '" + FLAGS_out + "' failed");
  return 0;
}

int Secret() {
  uint8_t bytes[32];
  if (tessera::Status st = fabric::RandomBytes(bytes); !st.ok()) return Fail(st.ToString());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return Emit(s + "\n");
}

int Issue() {
  if (FLAGS_client.empty()) UsageError(kSpec, "issue needs --client NAME");
  if (FLAGS_secret_file.empty()) {
    UsageError(kSpec, "issue needs --secret_file F (the cluster secret the memservers use)");
  }
  auto secret = fabric::LoadAuthSecret(FLAGS_secret_file, "tessera token issue");
  if (!secret.ok()) return Fail(secret.status().ToString());
  auto cred = fabric::IssueCredential(*secret, FLAGS_client,
                                      FLAGS_admin ? fabric::Role::kAdmin : fabric::Role::kClient);
  if (!cred.ok()) return Fail(cred.status().ToString());
  return Emit(fabric::FormatCredential(*cred));
}

int Show() {
  if (FLAGS_token_file.empty()) UsageError(kSpec, "show needs --token_file F");
  auto cred = fabric::LoadCredential(FLAGS_token_file, "tessera token show");
  if (!cred.ok()) return Fail(cred.status().ToString());
  nlohmann::json j;
  j["file"] = FLAGS_token_file;
  j["kind"] = cred->cluster_secret ? "cluster-secret" : "token";
  j["role"] = std::string(fabric::RoleName(cred->role));
  j["name"] = cred->name;
  j["client_id"] = cred->client_id;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  const std::string verb = argv[1];
  if (verb != "issue" && (!FLAGS_client.empty() || FLAGS_admin || !FLAGS_secret_file.empty())) {
    UsageError(kSpec, "--client, --admin and --secret_file belong to 'issue'");
  }
  if (verb == "secret") return Secret();
  if (verb == "issue") return Issue();
  if (verb == "show") return Show();
  UsageError(kSpec, "unknown verb '" + verb + "' (secret, issue, show)");
}
