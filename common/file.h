// Small whole-file helpers.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera {

// Writes `text` to path.tmp, then renames it over `path`: a reader sees the old file or the new
// one, never a part of either (stats files rewritten while tools read them).
Status WriteFileAtomically(const std::string& path, std::string_view text);

// The `key value` lines of a file (the stats files tools rewrite): the key up to the line's first
// space, the rest of the line its value; a line with no space is skipped. Empty when the file
// cannot be read.
using KeyValues = std::map<std::string, std::string>;
KeyValues ReadKeyValues(const std::string& path);

}  // namespace tessera
