#include "memserver/kv_service.h"

namespace tessera::memserver {
namespace {

using fabric::KvOutcome;
using Reply = std::optional<Result<std::vector<uint8_t>>>;

template <typename Body>
std::vector<uint8_t> Encode(const Body& body, std::span<const uint8_t> data = {}) {
  std::vector<uint8_t> out(Body::kWireSize + data.size());
  body.EncodeTo(out.data());
  if (!data.empty()) std::memcpy(out.data() + Body::kWireSize, data.data(), data.size());
  return out;
}

std::vector<uint8_t> WriteReply(const KvTable::WriteResult& r) {
  fabric::KvWriteResponse w;
  w.version = r.version;
  w.outcome = r.conflict ? KvOutcome::kConflict : KvOutcome::kDone;
  return Encode(w);
}

}  // namespace

Result<std::unique_ptr<KvService>> KvService::Create(SlabPool* pool, OffloadOptions offload) {
  std::unique_ptr<KvService> s(new KvService());
  s->store_ = std::make_unique<KvStore>(pool);
  TESSERA_ASSIGN_OR_RETURN(s->runtime_, OffloadRuntime::Create(s->store_.get(), std::move(offload)));
  return s;
}

std::optional<Result<std::vector<uint8_t>>> KvService::Handle(const fabric::ParsedFrame& f,
                                                              fabric::AsyncReply reply) {
  switch (f.header.op) {
    case fabric::Op::kKvGet: {
      const auto& req = std::get<fabric::KvKeyRequest>(f.body);
      KvTable* t = store_->Table(req.table, false);
      std::vector<uint8_t> value;
      const uint64_t version = t != nullptr ? t->Get(f.data, &value) : 0;
      if (version == 0) return Reply(NotFound("no such key in table ", req.table));
      return Reply(Encode(fabric::KvValueHeader{version, static_cast<uint32_t>(value.size())}, value));
    }
    case fabric::Op::kKvMultiGet: {
      const auto& req = std::get<fabric::KvMultiGetRequest>(f.body);
      auto keys = fabric::ParseKvMultiGetKeys(req, f.data);
      if (!keys.ok()) return Reply(keys.status());
      KvTable* t = store_->Table(req.table, false);
      std::vector<uint8_t> out, value;
      for (const auto& key : *keys) {
        const uint64_t version = t != nullptr ? t->Get(key, &value) : 0;
        fabric::AppendKvValue(out, version, version != 0 ? std::span<const uint8_t>(value)
                                                         : std::span<const uint8_t>());
      }
      return Reply(std::move(out));
    }
    case fabric::Op::kKvPut: {
      const auto& req = std::get<fabric::KvPutRequest>(f.body);
      KvTable* t = store_->Table(req.table, true);
      auto r = t->Put(f.data.first(req.key_len), f.data.subspan(req.key_len), req.expect_version);
      if (!r.ok()) return Reply(r.status());
      return Reply(WriteReply(*r));
    }
    case fabric::Op::kKvDelete: {
      const auto& req = std::get<fabric::KvDeleteRequest>(f.body);
      KvTable* t = store_->Table(req.table, false);
      if (t == nullptr) return Reply(NotFound("no such key in table ", req.table));
      auto r = t->Delete(f.data, req.expect_version);
      if (!r.ok()) return Reply(r.status());
      return Reply(WriteReply(*r));
    }
    case fabric::Op::kKvCommit: {
      const auto& req = std::get<fabric::KvCommitRequest>(f.body);
      auto items = fabric::ParseKvCommitItems(req, f.data);
      if (!items.ok()) return Reply(items.status());
      std::vector<KvTable::ReadItem> reads;
      for (const auto& r : items->reads) reads.push_back({r.key, r.version});
      std::vector<KvTable::WriteItem> writes;
      for (const auto& w : items->writes) writes.push_back({w.key, w.value, w.is_delete});
      auto r = store_->Table(req.table, true)->Commit(reads, writes);
      if (!r.ok()) return Reply(r.status());
      return Reply(WriteReply(*r));
    }
    case fabric::Op::kKvInvoke: {
      const auto& req = std::get<fabric::KvInvokeRequest>(f.body);
      if (auto r = runtime_->TryInline(req.table, req.function_id, f.data)) {
        // A cheap built-in ran here on the I/O thread: answered at once, no hand-off.
        if (!r->ok()) return Reply(r->status());
        if ((*r)->result.size() + fabric::KvInvokeResponse::kWireSize > fabric::kMaxDataLength) {
          return Reply(Internal("offload result of ", (*r)->result.size(), " bytes is too large"));
        }
        return Reply(Encode(fabric::KvInvokeResponse{KvOutcome::kDone, (*r)->attempts}, (*r)->result));
      }
      auto done = [reply](Result<InvokeResult> r) {
        if (!r.ok()) return reply.Send(r.status());
        if (r->result.size() + fabric::KvInvokeResponse::kWireSize > fabric::kMaxDataLength) {
          return reply.Send(Internal("offload result of ", r->result.size(), " bytes is too large"));
        }
        reply.Send(Encode(fabric::KvInvokeResponse{KvOutcome::kDone, r->attempts}, r->result));
      };
      auto s = runtime_->Submit(req.table, req.function_id,
                                std::vector<uint8_t>(f.data.begin(), f.data.end()),
                                (req.flags & fabric::KvInvokeRequest::kNoPushback) != 0, done);
      if (!s.ok()) return Reply(s.status());
      if (*s == OffloadRuntime::SubmitOutcome::kPushedBack) {
        return Reply(Encode(fabric::KvInvokeResponse{KvOutcome::kPushedBack, 0}));
      }
      return std::nullopt;
    }
    default:
      break;
  }
  return Reply(Internal("KvService got ", fabric::OpName(f.header.op)));
}

std::string KvService::StatsText() { return store_->StatsText() + runtime_->StatsText(); }

}  // namespace tessera::memserver
