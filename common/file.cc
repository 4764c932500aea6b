#include "common/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>

namespace tessera {

Status WriteFileAtomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open " + tmp);
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status st = ErrnoError("write " + tmp);
      ::close(fd);
      return st;
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return ErrnoError("close " + tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp);
  return Status::Ok();
}

KeyValues ReadKeyValues(const std::string& path) {
  KeyValues kv;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) kv[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return kv;
}

}  // namespace tessera
