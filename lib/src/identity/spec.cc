// Parsing and printing of identity and time specs, reason names, and the
// length-prefixed encoding of composite identities.

#include <utility>

#include "kdedup/identity/extractor.h"

namespace kdedup::identity {
namespace {

constexpr std::string_view kJsonPrefix = "json:";
constexpr std::string_view kHeaderPrefix = "header:";

Result<IdentityPart> parse_part(std::string_view text) {
  const std::string quoted = "identity part '" + std::string(text) + "'";
  if (text == "key") return IdentityPart{PartKind::kKey, {}};
  if (text == "value") return IdentityPart{PartKind::kValue, {}};
  if (text.starts_with(kHeaderPrefix)) {
    std::string_view name = text.substr(kHeaderPrefix.size());
    if (name.empty()) return fail(quoted + ": header name is empty (use header:NAME)");
    return IdentityPart{PartKind::kHeader, std::string(name)};
  }
  if (text.starts_with(kJsonPrefix)) {
    std::string_view pointer = text.substr(kJsonPrefix.size());
    if (auto ok = validate_json_pointer(pointer); !ok) {
      return fail(quoted + ": " + ok.error().message);
    }
    return IdentityPart{PartKind::kJson, std::string(pointer)};
  }
  if (text.empty()) return fail("identity spec has an empty part (stray comma?)");
  return fail(quoted + ": unknown kind (use key, value, header:NAME or json:/pointer)");
}

}  // namespace

const char* to_string(Reason reason) noexcept {
  switch (reason) {
    case Reason::kMissingKey:
      return "missing_key";
    case Reason::kNullValue:
      return "null_value";
    case Reason::kNotJson:
      return "not_json";
    case Reason::kNotObject:
      return "not_object";
    case Reason::kMissingField:
      return "missing_field";
    case Reason::kNullField:
      return "null_field";
    case Reason::kMissingHeader:
      return "missing_header";
    case Reason::kNullHeader:
      return "null_header";
    case Reason::kBadTime:
      return "bad_time";
    case Reason::kTooLarge:
      return "too_large";
  }
  return "unknown";
}

std::optional<Reason> parse_reason(std::string_view name) noexcept {
  for (Reason r : kAllReasons) {
    if (name == to_string(r)) return r;
  }
  return std::nullopt;
}

Status validate_json_pointer(std::string_view pointer) {
  const std::string quoted = "JSON pointer '" + std::string(pointer) + "'";
  if (pointer.empty()) return {};  // RFC 6901: the whole document
  if (pointer.front() != '/') {
    return fail(quoted + " must start with '/' (RFC 6901, e.g. /user/id)");
  }
  for (std::size_t i = 0; i < pointer.size(); ++i) {
    if (pointer[i] != '~') continue;
    if (i + 1 == pointer.size() || (pointer[i + 1] != '0' && pointer[i + 1] != '1')) {
      return fail(quoted + " has '~' not followed by 0 or 1 (write ~0 for '~', ~1 for '/')");
    }
  }
  return {};
}

bool IdentitySpec::reads_headers() const noexcept {
  for (const auto& p : parts) {
    if (p.kind == PartKind::kHeader) return true;
  }
  return false;
}

bool IdentitySpec::needs_json() const noexcept {
  for (const auto& p : parts) {
    if (p.kind == PartKind::kJson) return true;
  }
  return false;
}

std::string IdentitySpec::to_string() const {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += ',';
    switch (p.kind) {
      case PartKind::kKey:
        out += "key";
        break;
      case PartKind::kValue:
        out += "value";
        break;
      case PartKind::kHeader:
        out += std::string(kHeaderPrefix) + p.arg;
        break;
      case PartKind::kJson:
        out += std::string(kJsonPrefix) + p.arg;
        break;
    }
  }
  return out;
}

Result<IdentitySpec> parse_identity_spec(std::string_view text) {
  if (text.empty())
    return fail("identity spec is empty (use key, value, header:NAME or json:/ptr)");
  IdentitySpec spec;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view piece = text.substr(start, comma - start);
    auto part = parse_part(piece);
    if (!part) return tl::unexpected(part.error());
    spec.parts.push_back(std::move(*part));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return spec;
}

Result<TimeSpec> parse_time_spec(std::string_view text) {
  if (!text.starts_with(kJsonPrefix)) {
    return fail("time spec '" + std::string(text) + "' must be json:/pointer (epoch milliseconds)");
  }
  std::string_view pointer = text.substr(kJsonPrefix.size());
  if (pointer.empty()) return fail("time spec '" + std::string(text) + "' needs a field pointer");
  if (auto ok = validate_json_pointer(pointer); !ok) {
    return fail("time spec: " + ok.error().message);
  }
  return TimeSpec{std::string(pointer)};
}

void append_length_prefixed(std::string& out, std::string_view part) {
  std::uint64_t n = part.size();
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7F) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  out.append(part);
}

}  // namespace kdedup::identity
