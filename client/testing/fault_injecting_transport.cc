#include "client/testing/fault_injecting_transport.h"

#include <algorithm>

namespace tessera::client::testing {

void TransportFaults::CorruptReadsFrom(const std::string& endpoint, bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (on) {
    corrupt_.insert(endpoint);
  } else {
    corrupt_.erase(endpoint);
  }
}

void TransportFaults::FailOpsTo(const std::string& endpoint, bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (on) {
    fail_.insert(endpoint);
  } else {
    fail_.erase(endpoint);
  }
}

void TransportFaults::DropConnectionTo(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  drop_.insert(endpoint);
}

bool TransportFaults::TakeDrop(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  return drop_.erase(endpoint) > 0;
}

void TransportFaults::NoteConnect(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  ++connects_[endpoint];
}

uint64_t TransportFaults::connects_to(const std::string& endpoint) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connects_.find(endpoint);
  return it == connects_.end() ? 0 : it->second;
}

bool TransportFaults::corrupting(const std::string& endpoint) const {
  std::lock_guard<std::mutex> lock(mu_);
  return corrupt_.count(endpoint) > 0;
}

bool TransportFaults::failing(const std::string& endpoint) const {
  std::lock_guard<std::mutex> lock(mu_);
  return fail_.count(endpoint) > 0;
}

Result<fabric::ConnectionId> FaultInjectingTransport::Connect(
    const fabric::Endpoint& endpoint, const fabric::ConnectOptions& options) {
  faults_->NoteConnect(endpoint.ToString());
  TESSERA_ASSIGN_OR_RETURN(fabric::ConnectionId c, inner_->Connect(endpoint, options));
  endpoint_[c] = endpoint.ToString();
  return c;
}

Status FaultInjectingTransport::Post(std::span<const fabric::WorkRequest> batch) {
  std::vector<fabric::WorkRequest> pass;
  pass.reserve(batch.size());
  std::vector<fabric::Completion> fail;
  std::vector<std::pair<uint64_t, ReadInfo>> corrupt;
  for (const fabric::WorkRequest& wr : batch) {
    auto it = endpoint_.find(wr.connection);
    const std::string& ep = it == endpoint_.end() ? std::string() : it->second;
    if (!ep.empty() && inner_->Connected(wr.connection) && faults_->TakeDrop(ep)) {
      (void)inner_->Abort(wr.connection);
      dropped_.insert(wr.connection);
    }
    const bool dropped = dropped_.count(wr.connection) > 0;
    if (!ep.empty() && (dropped || faults_->failing(ep))) {
      fabric::Completion comp;
      comp.kind = fabric::CompletionKind::kData;
      comp.cookie = wr.cookie;
      comp.connection = wr.connection;
      comp.status = Unavailable(dropped ? "injected fault: connection to " + ep + " dropped"
                                        : "injected fault: op to " + ep + " failed");
      fail.push_back(std::move(comp));
      continue;
    }
    if (wr.op == fabric::OpKind::kRead && !ep.empty() && faults_->corrupting(ep)) {
      corrupt.push_back({wr.cookie, ReadInfo{static_cast<uint8_t*>(wr.local), wr.length}});
    }
    pass.push_back(wr);
  }
  if (!pass.empty()) TESSERA_RETURN_IF_ERROR(inner_->Post(pass));  // All or nothing.
  for (auto& c : fail) failed_.push_back(std::move(c));
  faults_->ops_failed.fetch_add(fail.size());
  for (auto& [cookie, info] : corrupt) to_corrupt_[cookie] = info;
  return Status::Ok();
}

size_t FaultInjectingTransport::TakeFailed(std::span<fabric::Completion> out) {
  const size_t n = std::min(out.size(), failed_.size());
  for (size_t i = 0; i < n; ++i) out[i] = std::move(failed_[i]);
  failed_.erase(failed_.begin(), failed_.begin() + static_cast<ptrdiff_t>(n));
  return n;
}

size_t FaultInjectingTransport::Mangle(std::span<fabric::Completion> out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (out[i].kind != fabric::CompletionKind::kData) continue;
    auto it = to_corrupt_.find(out[i].cookie);
    if (it == to_corrupt_.end()) continue;
    if (out[i].status.ok() && it->second.length > 0) {
      it->second.local[it->second.length / 2] ^= 0x5a;
      faults_->reads_corrupted.fetch_add(1);
    }
    to_corrupt_.erase(it);
  }
  return n;
}

size_t FaultInjectingTransport::Poll(std::span<fabric::Completion> out) {
  size_t n = TakeFailed(out);
  return n + Mangle(out.subspan(n), inner_->Poll(out.subspan(n)));
}

size_t FaultInjectingTransport::Wait(std::span<fabric::Completion> out, Deadline deadline) {
  if (!failed_.empty()) return Poll(out);
  return Mangle(out, inner_->Wait(out, deadline));
}

std::function<Result<std::unique_ptr<fabric::Transport>>(const fabric::TransportOptions&)>
FaultInjectingFactory(std::shared_ptr<TransportFaults> faults) {
  return
      [faults](const fabric::TransportOptions& to) -> Result<std::unique_ptr<fabric::Transport>> {
        TESSERA_ASSIGN_OR_RETURN(auto inner, fabric::Transport::Create(to));
        return std::unique_ptr<fabric::Transport>(
            new FaultInjectingTransport(std::move(inner), faults));
      };
}

}  // namespace tessera::client::testing
