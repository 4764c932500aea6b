// Per-client credentials (see fabric/credential.h).
#include "fabric/credential.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "common/coding.h"
#include "common/logging.h"
#include "fabric/wire.h"

namespace tessera::fabric {
namespace {

std::string Hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// The first line that is neither empty nor a '#' comment.
std::string_view FirstContentLine(std::string_view text) {
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    if (!line.empty() && line.front() != '#') return line;
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return {};
}

Result<Credential> ParseToken(std::string_view text, std::string_view origin) {
  // Exactly one credential line; everything else empty or a comment.
  std::vector<std::string_view> lines;
  for (std::string_view rest = text; !rest.empty();) {
    size_t nl = rest.find('\n');
    std::string_view line = Trim(rest.substr(0, nl));
    if (!line.empty() && line.front() != '#') lines.push_back(line);
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  if (lines.size() != 1) {
    return InvalidArgument("credential file ", origin, " holds ", lines.size(),
                           " non-comment lines; a credential is exactly one line "
                           "'tessera-credential v1 role=... name=... id=... key=...'");
  }
  std::vector<std::string_view> words;
  for (std::string_view rest = lines[0]; !rest.empty();) {
    size_t sp = rest.find_first_of(" \t");
    std::string_view w = rest.substr(0, sp);
    if (!w.empty()) words.push_back(w);
    if (sp == std::string_view::npos) break;
    rest.remove_prefix(sp + 1);
  }
  if (words.size() < 2 || words[0] != kCredentialMagic) {
    return InvalidArgument("credential file ", origin, ": the line must start with '",
                           kCredentialMagic, " v1'");
  }
  if (words[1] != "v1") {
    return InvalidArgument("credential file ", origin, ": unsupported credential version '",
                           words[1], "' (this build reads v1)");
  }
  std::map<std::string_view, std::string_view> fields;
  for (size_t i = 2; i < words.size(); ++i) {
    size_t eq = words[i].find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return InvalidArgument("credential file ", origin, ": '", words[i],
                             "' is not a key=value field");
    }
    std::string_view k = words[i].substr(0, eq);
    if (k != "role" && k != "name" && k != "id" && k != "key") {
      return InvalidArgument("credential file ", origin, ": unknown field '", k,
                             "' (fields: role, name, id, key)");
    }
    if (!fields.emplace(k, words[i].substr(eq + 1)).second) {
      return InvalidArgument("credential file ", origin, ": field '", k, "' appears twice");
    }
  }
  for (std::string_view k : {"role", "name", "id", "key"}) {
    if (!fields.contains(k)) {
      return InvalidArgument("credential file ", origin, ": missing field '", k, "'");
    }
  }
  Credential c;
  if (fields["role"] == "client") {
    c.role = Role::kClient;
  } else if (fields["role"] == "admin") {
    c.role = Role::kAdmin;
  } else {
    return InvalidArgument("credential file ", origin, ": role '", fields["role"],
                           "' is neither 'client' nor 'admin'");
  }
  c.name = std::string(fields["name"]);
  if (Status st = ValidateClientName(c.name); !st.ok()) {
    return st.WithContext("credential file " + std::string(origin));
  }
  std::string_view id = fields["id"];
  auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), c.client_id);
  if (ec != std::errc() || end != id.data() + id.size() || c.client_id == 0) {
    return InvalidArgument("credential file ", origin, ": id '", id,
                           "' is not a non-zero decimal number");
  }
  if (c.client_id != ClientIdForName(c.name)) {
    return InvalidArgument("credential file ", origin, ": id ", c.client_id,
                           " does not belong to name '", c.name, "' (expected ",
                           ClientIdForName(c.name), "); the file is damaged or edited");
  }
  std::string_view hex = fields["key"];
  if (hex.size() != 2 * kMacSize) {
    return InvalidArgument("credential file ", origin, ": key has ", hex.size(),
                           " characters; it must be exactly ", 2 * kMacSize, " hex digits");
  }
  c.key.resize(kMacSize);
  for (size_t i = 0; i < kMacSize; ++i) {
    int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument("credential file ", origin, ": key has a non-hex character at "
                             "position ", (hi < 0 ? 2 * i : 2 * i + 1));
    }
    c.key[i] = static_cast<char>(hi << 4 | lo);
  }
  return c;
}

Mac KeyedMac(std::string_view key, std::string_view label, uint64_t id) {
  ByteWriter msg;
  msg.PutBytes(AsBytes(label)).PutFixed64(id);
  return HmacSha256(AsBytes(key), msg.Take());
}

}  // namespace

std::string_view RoleName(Role role) { return role == Role::kAdmin ? "admin" : "client"; }

uint64_t ClientIdForName(std::string_view name) {
  Sha256 h;
  h.Update(std::string_view("tessera-v1-client-id\n"));
  h.Update(name);
  Sha256Digest d = h.Finish();
  uint64_t id = DecodeFixed64(d.data()) & ~(uint64_t{1} << 63);
  return id == 0 ? 1 : id;
}

Status ValidateClientName(std::string_view name) {
  if (name.empty() || name.size() > kMaxClientNameLength) {
    return InvalidArgument("client name '", name, "' must be 1..", kMaxClientNameLength,
                           " characters");
  }
  for (char ch : name) {
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '@' || ch == '-';
    if (!ok) {
      return InvalidArgument("client name '", name,
                             "' may hold only letters, digits and . _ @ -");
    }
  }
  return Status::Ok();
}

std::string DeriveKey(std::string_view cluster_secret, uint64_t client_id, Role role) {
  Mac m = KeyedMac(cluster_secret,
                   role == Role::kAdmin ? "tessera-v1-admin-key" : "tessera-v1-client-key",
                   client_id);
  return std::string(reinterpret_cast<const char*>(m.data()), m.size());
}

Result<Credential> IssueCredential(std::string_view cluster_secret, std::string_view name,
                                   Role role) {
  TESSERA_RETURN_IF_ERROR(ValidateClientName(name));
  if (cluster_secret.empty()) return InvalidArgument("the cluster secret is empty");
  Credential c;
  c.role = role;
  c.name = std::string(name);
  c.client_id = ClientIdForName(name);
  c.key = DeriveKey(cluster_secret, c.client_id, role);
  return c;
}

std::string FormatCredential(const Credential& c) {
  std::ostringstream out;
  out << "# tessera " << RoleName(c.role) << " credential for '" << c.name
      << "' (tessera token issue). Keep it private: it lets its holder act as this client.\n"
      << kCredentialMagic << " v1 role=" << RoleName(c.role) << " name=" << c.name
      << " id=" << c.client_id << " key=" << Hex(c.key) << "\n";
  return out.str();
}

Result<Credential> ParseCredential(std::string_view text, std::string_view origin) {
  std::string_view first = FirstContentLine(text);
  if (first.substr(0, kCredentialMagic.size()) == kCredentialMagic) {
    return ParseToken(text, origin);
  }
  // A cluster secret: the same rules as LoadAuthSecret.
  std::string s(text);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < 16) {
    return InvalidArgument("auth token file ", origin, " holds ", s.size(),
                           " bytes; a cluster secret must be at least 16 bytes (or the file "
                           "must hold a '", kCredentialMagic, " v1 ...' line)");
  }
  if (s.size() > 4096) {
    return InvalidArgument("auth token file ", origin, " is larger than 4096 bytes");
  }
  Credential c;
  c.role = Role::kAdmin;
  c.cluster_secret = true;
  c.key = std::move(s);
  return c;
}

Result<Credential> LoadCredential(const std::string& path, std::string_view tool) {
  if (path.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::string dev, LoadAuthSecret("", tool));
    Credential c;
    c.role = Role::kAdmin;
    c.cluster_secret = true;
    c.key = std::move(dev);
    return c;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open auth token file '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("reading auth token file '", path, "' failed");
  return ParseCredential(ss.str(), "'" + path + "'");
}

std::optional<VerifiedClient> VerifyClientMac(std::string_view cluster_secret,
                                              const HandshakeTranscript& t,
                                              const Mac& client_mac) {
  std::string client_key = DeriveKey(cluster_secret, t.client_id, Role::kClient);
  std::string admin_key = DeriveKey(cluster_secret, t.client_id, Role::kAdmin);
  // All three are computed and compared whatever matches, so the time taken does not say which.
  bool is_client = MacEqual(client_mac, ClientMac(client_key, t));
  bool is_admin = MacEqual(client_mac, ClientMac(admin_key, t));
  bool is_secret = MacEqual(client_mac, ClientMac(cluster_secret, t));
  std::optional<VerifiedClient> out;
  if (is_client) {
    out = VerifiedClient{Role::kClient, false, std::move(client_key)};
  } else if (is_admin) {
    out = VerifiedClient{Role::kAdmin, false, std::move(admin_key)};
  } else if (is_secret) {
    out = VerifiedClient{Role::kAdmin, true, std::string(cluster_secret)};
  }
  return out;
}

}  // namespace tessera::fabric
