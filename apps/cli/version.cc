#include "apps/cli/version.h"

#include "common/prometheus.h"

namespace tessera::version {

std::string Text(const std::string& name) {
  return name + " " + Version() + " (commit " + Commit() + ")\nfeatures: " + Features() + "\n";
}

std::string PrometheusBuildInfo(const std::string& component) {
  return tessera::PrometheusBuildInfo(component, Version(), Commit(), Features());
}

}  // namespace tessera::version
