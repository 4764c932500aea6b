#include "fabric/cluster_file.h"

#include <fstream>
#include <set>
#include <sstream>

namespace tessera::fabric {
namespace {

bool ValidRack(std::string_view r) {
  if (r.empty() || r.size() > 64) return false;
  for (char c : r) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string_view> SplitWords(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
    size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t' && s[i] != '\r') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace

Result<std::vector<ClusterMember>> ParseClusterFile(std::string_view text, std::string_view source) {
  std::vector<ClusterMember> out;
  std::set<std::string> seen;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line =
        text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = (nl == std::string_view::npos) ? text.size() + 1 : nl + 1;
    ++line_no;
    size_t hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string_view> words = SplitWords(line);
    if (words.empty()) continue;
    auto err = [&](auto... what) {
      return InvalidArgument(source, ":", line_no, ": ", what...);
    };
    if (words.size() > 2) return err("want 'HOST:PORT [rack=NAME]', got ", words.size(), " words");
    auto ep = ParseEndpoint(words[0]);
    if (!ep.ok()) return err(ep.status().message());
    ClusterMember m;
    m.endpoint = *ep;
    m.line = line_no;
    if (words.size() == 2) {
      std::string_view w = words[1];
      if (w.substr(0, 5) != "rack=") return err("unknown attribute '", w, "' (want rack=NAME)");
      std::string_view rack = w.substr(5);
      if (!ValidRack(rack)) return err("bad rack name '", rack, "' (want [A-Za-z0-9._-]{1,64})");
      m.rack = std::string(rack);
    }
    std::string key = m.endpoint.ToString();
    if (!seen.insert(key).second) return err("duplicate server ", key);
    out.push_back(std::move(m));
  }
  return out;
}

Result<std::vector<ClusterMember>> LoadClusterFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open cluster file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("reading cluster file '", path, "' failed");
  TESSERA_ASSIGN_OR_RETURN(auto members, ParseClusterFile(ss.str(), path));
  if (members.empty()) return InvalidArgument("cluster file '", path, "' lists no servers");
  return members;
}

}  // namespace tessera::fabric
