#include "apps/kayak/server/kv_service.h"

#include <cstring>

namespace tessera::kayak {
namespace {

using wire::KvOutcome;
using wire::Payload;
using Reply = std::optional<Result<std::vector<uint8_t>>>;

constexpr uint16_t U(fabric::Op op) { return static_cast<uint16_t>(op); }

std::vector<uint8_t> WriteReply(const KvTable::WriteResult& r) {
  wire::KvWriteResponse w;
  w.version = r.version;
  w.outcome = r.conflict ? KvOutcome::kConflict : KvOutcome::kDone;
  return Payload(w);
}

}  // namespace

Result<std::unique_ptr<KvService>> KvService::Create(SlabPool* pool, OwnerId owner,
                                                     OffloadOptions offload) {
  std::unique_ptr<KvService> s(new KvService());
  s->store_ = std::make_unique<KvStore>(pool, owner);
  TESSERA_ASSIGN_OR_RETURN(s->runtime_, OffloadRuntime::Create(s->store_.get(), std::move(offload)));
  return s;
}

std::optional<Result<std::vector<uint8_t>>> KvService::HandleRequest(
    const fabric::PeerInfo& peer, fabric::Op op, std::span<const uint8_t> payload,
    fabric::AsyncReply reply) {
  (void)peer;
  auto parsed = wire::ParseRequest(op, payload);
  if (!parsed.ok()) return Reply(parsed.status());
  const wire::ParsedKv& f = *parsed;
  switch (static_cast<uint16_t>(op)) {
    case U(wire::kKvGet): {
      const auto& req = std::get<wire::KvKeyRequest>(f.body);
      KvTable* t = store_->Table(req.table, false);
      std::vector<uint8_t> value;
      const uint64_t version = t != nullptr ? t->Get(f.data, &value) : 0;
      if (version == 0) return Reply(NotFound("no such key in table ", req.table));
      return Reply(Payload(wire::KvValueHeader{version, static_cast<uint32_t>(value.size())}, value));
    }
    case U(wire::kKvMultiGet): {
      const auto& req = std::get<wire::KvMultiGetRequest>(f.body);
      auto keys = wire::ParseKvMultiGetKeys(req, f.data);
      if (!keys.ok()) return Reply(keys.status());
      KvTable* t = store_->Table(req.table, false);
      std::vector<uint8_t> out, value;
      for (const auto& key : *keys) {
        const uint64_t version = t != nullptr ? t->Get(key, &value) : 0;
        wire::AppendKvValue(out, version, version != 0 ? std::span<const uint8_t>(value)
                                                         : std::span<const uint8_t>());
      }
      return Reply(std::move(out));
    }
    case U(wire::kKvPut): {
      const auto& req = std::get<wire::KvPutRequest>(f.body);
      KvTable* t = store_->Table(req.table, true);
      auto r = t->Put(f.data.first(req.key_len), f.data.subspan(req.key_len), req.expect_version);
      if (!r.ok()) return Reply(r.status());
      return Reply(WriteReply(*r));
    }
    case U(wire::kKvDelete): {
      const auto& req = std::get<wire::KvDeleteRequest>(f.body);
      KvTable* t = store_->Table(req.table, false);
      if (t == nullptr) return Reply(NotFound("no such key in table ", req.table));
      auto r = t->Delete(f.data, req.expect_version);
      if (!r.ok()) return Reply(r.status());
      return Reply(WriteReply(*r));
    }
    case U(wire::kKvCommit): {
      const auto& req = std::get<wire::KvCommitRequest>(f.body);
      auto items = wire::ParseKvCommitItems(req, f.data);
      if (!items.ok()) return Reply(items.status());
      std::vector<KvTable::ReadItem> reads;
      for (const auto& r : items->reads) reads.push_back({r.key, r.version});
      std::vector<KvTable::WriteItem> writes;
      for (const auto& w : items->writes) writes.push_back({w.key, w.value, w.is_delete});
      auto r = store_->Table(req.table, true)->Commit(reads, writes);
      if (!r.ok()) return Reply(r.status());
      return Reply(WriteReply(*r));
    }
    case U(wire::kKvInvoke): {
      const auto& req = std::get<wire::KvInvokeRequest>(f.body);
      if (auto r = runtime_->TryInline(req.table, req.function_id, f.data)) {
        // A cheap built-in ran here on the I/O thread: answered at once, no hand-off.
        if (!r->ok()) return Reply(r->status());
        if ((*r)->result.size() + wire::KvInvokeResponse::kWireSize > fabric::kMaxDataLength) {
          return Reply(Internal("offload result of ", (*r)->result.size(), " bytes is too large"));
        }
        return Reply(Payload(wire::KvInvokeResponse{KvOutcome::kDone, (*r)->attempts}, (*r)->result));
      }
      auto done = [reply](Result<InvokeResult> r) {
        if (!r.ok()) return reply.Send(r.status());
        if (r->result.size() + wire::KvInvokeResponse::kWireSize > fabric::kMaxDataLength) {
          return reply.Send(Internal("offload result of ", r->result.size(), " bytes is too large"));
        }
        reply.Send(Payload(wire::KvInvokeResponse{KvOutcome::kDone, r->attempts}, r->result));
      };
      auto s = runtime_->Submit(req.table, req.function_id,
                                std::vector<uint8_t>(f.data.begin(), f.data.end()),
                                (req.flags & wire::KvInvokeRequest::kNoPushback) != 0, done);
      if (!s.ok()) return Reply(s.status());
      if (*s == OffloadRuntime::SubmitOutcome::kPushedBack) {
        return Reply(Payload(wire::KvInvokeResponse{KvOutcome::kPushedBack, 0}));
      }
      return std::nullopt;
    }
    default:
      break;
  }
  return Reply(Internal("the KV service got ", wire::KvOpName(op)));
}

std::string KvService::StatsText() { return store_->StatsText() + runtime_->StatsText(); }

memserver::ServicePlugin Plugin(OffloadOptions offload) {
  memserver::ServicePlugin plugin;
  plugin.name = "kayak";
  plugin.create = [offload = std::move(offload)](memserver::ServiceHost& host)
      -> Result<std::unique_ptr<memserver::Service>> {
    OffloadOptions o = offload;
    o.workers = host.cpu().workers;
    o.budget_ns = host.cpu().budget_ns;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<KvService> kv,
                             KvService::Create(&host.slabs(), host.slab_owner(), std::move(o)));
    TESSERA_RETURN_IF_ERROR(host.RegisterRequestTypes(wire::kFirstOp, wire::kLastOp, kv.get()));
    return std::unique_ptr<memserver::Service>(std::move(kv));
  };
  return plugin;
}

}  // namespace tessera::kayak
