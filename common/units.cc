#include "common/units.h"

#include <cctype>
#include <cstdio>

namespace tessera {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "123abc" into the number 123 and the suffix "abc". Only decimal digits.
Status SplitNumber(std::string_view text, uint64_t* number, std::string* suffix) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return OutOfRange("number too large in '", text, "'");
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) return InvalidArgument("expected a number at the start of '", text, "'");
  *number = v;
  *suffix = Lower(text.substr(i));
  return Status::Ok();
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) {
  uint64_t n = 0;
  std::string suffix;
  TESSERA_RETURN_IF_ERROR(SplitNumber(text, &n, &suffix));
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      case 't': shift = 40; break;
      case 'b': shift = 0; break;
      default:
        return InvalidArgument("bad size '", text, "' (use e.g. 4096, 64K, 16M, 1G)");
    }
    std::string rest = suffix.substr(1);
    bool ok = suffix[0] == 'b' ? rest.empty() : (rest.empty() || rest == "b" || rest == "ib");
    if (!ok) return InvalidArgument("bad size '", text, "' (use e.g. 4096, 64K, 16M, 1G)");
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) return OutOfRange("size '", text, "' overflows");
  return n << shift;
}

Result<uint64_t> ParseDurationNs(std::string_view text) {
  // NUMBER[.FRACTION]UNIT: "500ms", "1.5s", "2m", "1h".
  uint64_t n = 0;
  std::string suffix;
  TESSERA_RETURN_IF_ERROR(SplitNumber(text, &n, &suffix));
  uint64_t frac = 0, frac_scale = 1;
  if (!suffix.empty() && suffix[0] == '.') {
    size_t i = 1;
    while (i < suffix.size() && suffix[i] >= '0' && suffix[i] <= '9') {
      if (frac_scale >= 1000000000000000000ull) {
        return InvalidArgument("too many decimals in duration '", text, "'");
      }
      frac = frac * 10 + static_cast<uint64_t>(suffix[i] - '0');
      frac_scale *= 10;
      ++i;
    }
    if (i == 1) return InvalidArgument("bad duration '", text, "' (use e.g. 500ms, 1.5s, 2m, 1h)");
    suffix = suffix.substr(i);
  }
  uint64_t mult = 0;
  if (suffix == "ns") mult = 1;
  else if (suffix == "us") mult = 1000;
  else if (suffix == "ms") mult = 1000000;
  else if (suffix == "s") mult = 1000000000;
  else if (suffix == "m") mult = 60ull * 1000000000;
  else if (suffix == "h") mult = 3600ull * 1000000000;
  else return InvalidArgument("bad duration '", text, "' (use e.g. 500ms, 1.5s, 2m, 1h)");
  if (n > UINT64_MAX / mult) return OutOfRange("duration '", text, "' overflows");
  // The fraction, exactly: frac / frac_scale of the unit, in whole nanoseconds.
  const unsigned __int128 part = static_cast<unsigned __int128>(frac) * mult;
  if (part % frac_scale != 0) {
    return InvalidArgument("duration '", text, "' is finer than a nanosecond");
  }
  const uint64_t extra = static_cast<uint64_t>(part / frac_scale);
  if (n * mult > UINT64_MAX - extra) return OutOfRange("duration '", text, "' overflows");
  return n * mult + extra;
}

std::string FormatSize(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0 || v == static_cast<double>(static_cast<uint64_t>(v))) {
    std::snprintf(buf, sizeof(buf), "%llu %s", static_cast<unsigned long long>(v), kUnits[u]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  }
  return buf;
}

std::string FormatDurationNs(uint64_t ns) {
  char buf[48];
  auto fmt = [&](double v, const char* unit) {
    if (v == static_cast<double>(static_cast<uint64_t>(v))) {
      std::snprintf(buf, sizeof(buf), "%llu%s", static_cast<unsigned long long>(v), unit);
    } else {
      std::snprintf(buf, sizeof(buf), "%.1f%s", v, unit);
    }
  };
  if (ns < 1000) fmt(static_cast<double>(ns), "ns");
  else if (ns < 1000000) fmt(ns / 1e3, "us");
  else if (ns < 1000000000) fmt(ns / 1e6, "ms");
  else fmt(ns / 1e9, "s");
  return buf;
}

}  // namespace tessera
