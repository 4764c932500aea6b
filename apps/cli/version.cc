#include "apps/cli/version.h"

namespace tessera::version {

std::string Text(const std::string& name) {
  return name + " " + Version() + " (commit " + Commit() + ")\nfeatures: " + Features() + "\n";
}

}  // namespace tessera::version
