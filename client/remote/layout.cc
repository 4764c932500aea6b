// The factory of the Layout seam (layout.h): the one place that chooses a layout's class.
#include "client/remote/layout.h"

#include "client/remote/group_layout.h"
#include "client/remote/split_layout.h"

namespace tessera::client::remote {

std::unique_ptr<Layout> NewLayout(IoThread& io, const LayoutParams& lay) {
  if (lay.group) return std::make_unique<GroupLayout>(io, lay);
  return std::make_unique<SplitLayout>(io, lay);  // Split, and copies (k = 1, whole pages).
}

std::unique_ptr<StoreLayout> NewStoreLayout(const LayoutParams& lay) {
  if (lay.group) return std::make_unique<GroupStoreLayout>(lay);
  return std::make_unique<SplitStoreLayout>(lay);
}

}  // namespace tessera::client::remote
