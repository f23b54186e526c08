#pragma once
// Identity extraction: which bytes of a record say "this is the same event".
//
// An identity spec is one part or several separated by commas:
//   key            the record key
//   value          the whole value (`kdedup filter --key line`)
//   header:NAME    the value of the last header called NAME
//   json:/ptr      an RFC 6901 JSON Pointer into a JSON object value
// e.g. "json:/tenant,json:/order/id" or "header:tenant,json:/id". Commas
// always separate parts, so header names and pointers cannot contain one.
//
// Identity bytes:
// - key, value, header: the bytes as they are (opaque, any encoding; empty is
//   a valid identity, null is not).
// - json: a string field contributes its unescaped bytes; an integer its
//   decimal text; any other number its shortest round-trip text (so 2.50 and
//   2.5 are one identity); true/false their text; an object or array its
//   minified JSON. A string "1" and a number 1 therefore give the same bytes.
// - A single part is its bytes unchanged. Several parts are each prefixed by
//   their length (LEB128 varint), so ("ab","c") and ("a","bc") differ.
//
// Failures are values, never exceptions: an ExtractError carries a Reason
// with a stable short name (for metrics labels and error headers) and a
// message naming the pointer or header. Outcomes of awkward input:
// - null key with `key`: missing_key. Empty key: identity "" (valid).
// - null value with `value` or `json:`: null_value. Empty value: identity ""
//   with `value`; not_json with `json:`.
// - header absent: missing_header; present with a null value: null_header.
// - value not valid JSON, including invalid UTF-8 inside JSON, numbers that
//   fit neither 64-bit integers nor doubles, and objects/arrays nested deeper
//   than kMaxJsonDepth: not_json. Valid JSON that is not an object:
//   not_object.
// - pointer that does not resolve: missing_field; resolves to null: null_field.
// - value larger than ExtractorOptions::max_json_bytes (JSON parts only):
//   too_large. Large values are otherwise fine; the parser keeps the buffers
//   of the largest value it has seen for reuse.
// - time field that is not a non-negative integer (strings, fractions,
//   negatives, integers above 2^63-1): bad_time.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/identity/record.h"

namespace kdedup::identity {

/// Why an identity (or time) could not be extracted. The numeric values are
/// not persisted; to_string() names are stable and used as metric labels.
enum class Reason : std::uint8_t {
  kMissingKey,
  kNullValue,
  kNotJson,
  kNotObject,
  kMissingField,
  kNullField,
  kMissingHeader,
  kNullHeader,
  kBadTime,
  kTooLarge,
};

inline constexpr std::array<Reason, 10> kAllReasons{
    Reason::kMissingKey,   Reason::kNullValue, Reason::kNotJson,       Reason::kNotObject,
    Reason::kMissingField, Reason::kNullField, Reason::kMissingHeader, Reason::kNullHeader,
    Reason::kBadTime,      Reason::kTooLarge,
};

/// Stable short name: "missing_key", "null_value", "not_json", ...
[[nodiscard]] const char* to_string(Reason reason) noexcept;

/// Inverse of to_string(); nullopt for an unknown name.
[[nodiscard]] std::optional<Reason> parse_reason(std::string_view name) noexcept;

/// A failed extraction: the reason plus a message for a person, e.g.
/// "field /user/id is null".
struct ExtractError {
  Reason reason;
  std::string message;
};

template <class T>
using Extracted = tl::expected<T, ExtractError>;

enum class PartKind : std::uint8_t { kKey, kValue, kHeader, kJson };

/// One component of an identity spec.
struct IdentityPart {
  PartKind kind;
  std::string arg;  ///< header name (kHeader) or JSON Pointer (kJson); else empty

  friend bool operator==(const IdentityPart&, const IdentityPart&) = default;
};

/// A parsed identity spec; parts.size() >= 1.
struct IdentitySpec {
  std::vector<IdentityPart> parts;

  /// True when some part reads the value as JSON.
  [[nodiscard]] bool needs_json() const noexcept;
  /// True when some part reads a header.
  [[nodiscard]] bool reads_headers() const noexcept;
  /// The spec text that parses back to this spec.
  [[nodiscard]] std::string to_string() const;
};

/// Parses "key", "value", "header:NAME", "json:/ptr" and comma-separated
/// composites. The error names the offending part ("identity part 'jsn:/a':
/// unknown kind ...").
[[nodiscard]] Result<IdentitySpec> parse_identity_spec(std::string_view text);

/// Where an event time is read from: "json:/ptr" holding integer epoch
/// milliseconds.
struct TimeSpec {
  std::string pointer;
};

[[nodiscard]] Result<TimeSpec> parse_time_spec(std::string_view text);

/// Checks RFC 6901 syntax: empty (the whole document) or '/'-separated
/// tokens where '~' is only followed by '0' or '1'.
[[nodiscard]] Status validate_json_pointer(std::string_view pointer);

/// Appends `part` prefixed with its length as an LEB128 varint: the encoding
/// of each component of a composite identity.
void append_length_prefixed(std::string& out, std::string_view part);

/// Deepest nesting of objects and arrays a JSON value may have, the
/// outermost object counting as level 1 (`{"a":{"b":1}}` is 2 deep): the
/// parser's stack (simdjson's default). Deeper values are not_json.
inline constexpr std::size_t kMaxJsonDepth = 1024;

struct ExtractorOptions {
  /// Values longer than this are rejected with too_large before JSON parsing
  /// (bounds parser memory). The default is simdjson's own limit (4 GiB - 1).
  std::size_t max_json_bytes = 0xFFFFFFFFu;
};

/// What extract() found. `identity` stays valid until the next extract() call
/// on the same extractor or until the record's bytes go away, whichever is
/// first.
struct Extraction {
  std::string_view identity;
  std::optional<std::int64_t> time_ms;  ///< set iff the extractor has a TimeSpec
};

/// Extracts the identity (and optionally an event time) from records.
///
/// Parses a record's value as JSON at most once per extract() call, however
/// many parts read from it, and reuses its parser and buffers across calls.
/// Owned by one thread: extract() mutates internal buffers and is not
/// thread-safe; give each worker thread its own instance. Movable, not
/// copyable.
class IdentityExtractor {
 public:
  explicit IdentityExtractor(IdentitySpec spec, std::optional<TimeSpec> time = std::nullopt,
                             ExtractorOptions options = {});
  ~IdentityExtractor();
  IdentityExtractor(IdentityExtractor&&) noexcept;
  IdentityExtractor& operator=(IdentityExtractor&&) noexcept;
  IdentityExtractor(const IdentityExtractor&) = delete;
  IdentityExtractor& operator=(const IdentityExtractor&) = delete;

  /// Parses both specs; `time_spec` may be empty (no time). Errors name the
  /// spec that was wrong.
  [[nodiscard]] static Result<IdentityExtractor> create(std::string_view identity_spec,
                                                        std::string_view time_spec = {},
                                                        ExtractorOptions options = {});

  /// Extracts from one record. Failures of the identity parts come first (in
  /// spec order), then the time field's.
  [[nodiscard]] Extracted<Extraction> extract(const RecordView& record);

  [[nodiscard]] const IdentitySpec& spec() const noexcept { return spec_; }
  [[nodiscard]] const std::optional<TimeSpec>& time_spec() const noexcept { return time_; }

 private:
  struct Json;  // simdjson parser state, kept out of this header

  IdentitySpec spec_;
  std::optional<TimeSpec> time_;
  ExtractorOptions options_;
  bool needs_json_ = false;
  std::unique_ptr<Json> json_;
  std::string scratch_;    // text of a non-string JSON part
  std::string composite_;  // length-prefixed parts of a composite identity
};

}  // namespace kdedup::identity
