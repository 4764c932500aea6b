// Small whole-file helpers.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera {

// Writes `text` to path.tmp, then renames it over `path`: a reader sees the old file or the new
// one, never a part of either (stats files rewritten while tools read them).
Status WriteFileAtomically(const std::string& path, std::string_view text);

}  // namespace tessera
