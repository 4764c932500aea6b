#include "client/page_store.h"

#include <atomic>
#include <memory>
#include <vector>

namespace tessera::client {
namespace {

Status RunBlocking(PageStore* store, PageOp* ops, size_t count) {
  OpWaiter waiter;
  waiter.Arm(ops, count);
  std::vector<PageOp*> ptrs(count);
  for (size_t i = 0; i < count; ++i) ptrs[i] = &ops[i];
  TESSERA_RETURN_IF_ERROR(store->Submit(ptrs));
  return waiter.Wait(ops, count);
}

Status RunBatch(PageStore* store, PageOp::Kind kind, const PageId* pages, size_t count,
                uint8_t* bufs) {
  if (count == 0) return Status::Ok();
  if (pages == nullptr || bufs == nullptr) return InvalidArgument("null pages or buffer");
  std::unique_ptr<PageOp[]> ops(new PageOp[count]);
  for (size_t i = 0; i < count; ++i) {
    ops[i].kind = kind;
    ops[i].page = pages[i];
    ops[i].buf = bufs + i * kPageSize;
  }
  return RunBlocking(store, ops.get(), count);
}

}  // namespace

Result<std::vector<size_t>> PageStore::ServersOfPage(PageId page) const {
  (void)page;
  return InvalidArgument("not a remote store: " + name());
}

Status PageStore::ValidateBatch(std::span<PageOp* const> ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const PageOp* op = ops[i];
    if (op == nullptr) return InvalidArgument("op ", i, " of the batch is null");
    if (op->buf == nullptr) return InvalidArgument("op ", i, " (page ", op->page, ") has no buffer");
    if (op->done == nullptr) {
      return InvalidArgument("op ", i, " (page ", op->page, ") has no done callback");
    }
    if (op->kind != PageOp::Kind::kRead && op->kind != PageOp::Kind::kWrite) {
      return InvalidArgument("op ", i, " (page ", op->page, ") has an unknown kind ",
                             static_cast<int>(op->kind));
    }
  }
  return Status::Ok();
}

Status PageStore::ReadPage(PageId page, uint8_t* out) {
  PageOp op;
  op.kind = PageOp::Kind::kRead;
  op.page = page;
  op.buf = out;
  return RunBlocking(this, &op, 1);
}

Status PageStore::WritePage(PageId page, const uint8_t* in) {
  PageOp op;
  op.kind = PageOp::Kind::kWrite;
  op.page = page;
  op.buf = const_cast<uint8_t*>(in);  // A write only reads the buffer.
  return RunBlocking(this, &op, 1);
}

Status PageStore::ReadPages(const PageId* pages, size_t count, uint8_t* out) {
  return RunBatch(this, PageOp::Kind::kRead, pages, count, out);
}

Status PageStore::WritePages(const PageId* pages, size_t count, const uint8_t* in) {
  return RunBatch(this, PageOp::Kind::kWrite, pages, count, const_cast<uint8_t*>(in));
}

Result<std::unique_ptr<ThreadReader>> PageStore::NewThreadReader(const ThreadReaderOptions&) {
  return Unsupported(name(), " has no run-to-completion reader");
}

}  // namespace tessera::client
