// IdentityExtractor: one DOM parse of the value per record (simdjson's
// validating parser, so a malformed line is never half-accepted), then one
// pointer lookup per JSON part.

#include "kdedup/identity/extractor.h"

#include <charconv>
#include <limits>
#include <utility>

#include <simdjson.h>

namespace kdedup::identity {
namespace {

tl::unexpected<ExtractError> failure(Reason reason, std::string message) {
  return tl::unexpected<ExtractError>(ExtractError{reason, std::move(message)});
}

std::string field_name(std::string_view pointer) {
  return pointer.empty() ? std::string("(whole document)") : std::string(pointer);
}

const char* json_type_name(simdjson::dom::element_type type) {
  using T = simdjson::dom::element_type;
  switch (type) {
    case T::ARRAY:
      return "an array";
    case T::OBJECT:
      return "an object";
    case T::INT64:
    case T::UINT64:
      return "an integer";
    case T::DOUBLE:
      return "a fractional number";
    case T::STRING:
      return "a string";
    case T::BOOL:
      return "a boolean";
    case T::NULL_VALUE:
      return "null";
  }
  return "an unknown JSON type";
}

template <class Number>
void append_number(std::string& out, Number n) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, n);
  // 64 bytes hold any integer and the shortest round-trip form of any double.
  if (ec == std::errc()) out.append(buf, end);
}

}  // namespace

static_assert(kMaxJsonDepth == simdjson::DEFAULT_MAX_DEPTH,
              "the documented nesting limit is the parser's");

struct IdentityExtractor::Json {
  // Left at simdjson's maximum capacity: the parser rounds its allocations
  // up, so options_.max_json_bytes is enforced before parsing instead.
  simdjson::dom::parser parser;
};

IdentityExtractor::IdentityExtractor(IdentitySpec spec, std::optional<TimeSpec> time,
                                     ExtractorOptions options)
    : spec_(std::move(spec)), time_(std::move(time)), options_(options) {
  needs_json_ = spec_.needs_json() || time_.has_value();
  if (options_.max_json_bytes > simdjson::SIMDJSON_MAXSIZE_BYTES) {
    options_.max_json_bytes = simdjson::SIMDJSON_MAXSIZE_BYTES;
  }
  if (needs_json_) json_ = std::make_unique<Json>();
}

IdentityExtractor::~IdentityExtractor() = default;
IdentityExtractor::IdentityExtractor(IdentityExtractor&&) noexcept = default;
IdentityExtractor& IdentityExtractor::operator=(IdentityExtractor&&) noexcept = default;

Result<IdentityExtractor> IdentityExtractor::create(std::string_view identity_spec,
                                                    std::string_view time_spec,
                                                    ExtractorOptions options) {
  auto spec = parse_identity_spec(identity_spec);
  if (!spec) return tl::unexpected(spec.error());
  std::optional<TimeSpec> time;
  if (!time_spec.empty()) {
    auto parsed = parse_time_spec(time_spec);
    if (!parsed) return tl::unexpected(parsed.error());
    time = std::move(*parsed);
  }
  return IdentityExtractor(std::move(*spec), std::move(time), options);
}

namespace {

/// The record's value parsed as a JSON object (the parser keeps the
/// document until its next parse).
Extracted<simdjson::dom::element> parse_object(simdjson::dom::parser& parser,
                                               const RecordView& record,
                                               std::size_t max_json_bytes) {
  if (!record.value) return failure(Reason::kNullValue, "record value is null, expected JSON");
  const std::string_view value = *record.value;
  if (value.size() > max_json_bytes) {
    return failure(Reason::kTooLarge, "value is " + std::to_string(value.size()) +
                                          " bytes, over the JSON limit of " +
                                          std::to_string(max_json_bytes));
  }
  // parse() copies into the parser's own padded buffer, reused across calls.
  auto parsed = parser.parse(value.data(), value.size());
  if (parsed.error() == simdjson::CAPACITY) {
    return failure(Reason::kTooLarge, "value is too large for the JSON parser (" +
                                          std::to_string(value.size()) + " bytes)");
  }
  if (parsed.error() == simdjson::DEPTH_ERROR) {
    return failure(Reason::kNotJson,
                   "value nests objects and arrays deeper than the JSON limit "
                   "of " +
                       std::to_string(kMaxJsonDepth) + " levels");
  }
  if (parsed.error()) {
    return failure(Reason::kNotJson, std::string("value is not valid JSON: ") +
                                         simdjson::error_message(parsed.error()));
  }
  const simdjson::dom::element root = parsed.value_unsafe();
  if (root.type() != simdjson::dom::element_type::OBJECT) {
    return failure(Reason::kNotObject, std::string("value is JSON but ") +
                                           json_type_name(root.type()) + ", not an object");
  }
  return root;
}

/// Bytes of a JSON part: a string as it is, any other value as its text
/// (in `scratch`).
Extracted<std::string_view> json_part(const simdjson::dom::element& root,
                                      const std::string& pointer, std::string& scratch) {
  auto field = root.at_pointer(pointer);
  if (field.error()) {
    return failure(Reason::kMissingField, "field " + field_name(pointer) + " is missing");
  }
  const simdjson::dom::element e = field.value_unsafe();
  scratch.clear();
  switch (e.type()) {
    case simdjson::dom::element_type::NULL_VALUE:
      return failure(Reason::kNullField, "field " + field_name(pointer) + " is null");
    case simdjson::dom::element_type::STRING:
      return std::string_view(e.get_string().value_unsafe());
    case simdjson::dom::element_type::INT64:
      append_number(scratch, e.get_int64().value_unsafe());
      break;
    case simdjson::dom::element_type::UINT64:
      append_number(scratch, e.get_uint64().value_unsafe());
      break;
    case simdjson::dom::element_type::DOUBLE:
      append_number(scratch, e.get_double().value_unsafe());
      break;
    case simdjson::dom::element_type::BOOL:
      scratch = e.get_bool().value_unsafe() ? "true" : "false";
      break;
    case simdjson::dom::element_type::ARRAY:
    case simdjson::dom::element_type::OBJECT:
      scratch = simdjson::minify(e);
      break;
  }
  return std::string_view(scratch);
}

/// Bytes of one identity part; they may point into the record, the parser,
/// or `scratch`.
Extracted<std::string_view> part_bytes(const IdentityPart& part, const RecordView& record,
                                       const simdjson::dom::element& root, std::string& scratch) {
  switch (part.kind) {
    case PartKind::kKey:
      if (!record.key) return failure(Reason::kMissingKey, "record has a null key");
      return *record.key;
    case PartKind::kValue:
      if (!record.value) return failure(Reason::kNullValue, "record value is null");
      return *record.value;
    case PartKind::kHeader: {
      const RecordHeader* found = nullptr;
      for (const auto& h : record.headers) {
        if (h.name == part.arg) found = &h;  // last occurrence wins
      }
      if (!found) return failure(Reason::kMissingHeader, "header '" + part.arg + "' is missing");
      if (!found->value) {
        return failure(Reason::kNullHeader, "header '" + part.arg + "' has a null value");
      }
      return *found->value;
    }
    case PartKind::kJson:
      return json_part(root, part.arg, scratch);
  }
  return failure(Reason::kMissingField, "unknown identity part");
}

/// The event time at `pointer`: a non-negative integer of epoch milliseconds.
Extracted<std::int64_t> time_at(const simdjson::dom::element& root, const std::string& pointer) {
  auto field = root.at_pointer(pointer);
  if (field.error()) {
    return failure(Reason::kMissingField, "time field " + pointer + " is missing");
  }
  const simdjson::dom::element e = field.value_unsafe();
  if (e.type() == simdjson::dom::element_type::NULL_VALUE) {
    return failure(Reason::kNullField, "time field " + pointer + " is null");
  }
  if (e.type() != simdjson::dom::element_type::INT64 || e.get_int64().value_unsafe() < 0) {
    const char* what = e.type() == simdjson::dom::element_type::INT64    ? "a negative integer"
                       : e.type() == simdjson::dom::element_type::UINT64 ? "an integer over 2^63-1"
                                                                         : json_type_name(e.type());
    return failure(Reason::kBadTime, "time field " + pointer +
                                         " must be a non-negative integer of epoch "
                                         "milliseconds, got " +
                                         what);
  }
  return e.get_int64().value_unsafe();
}

}  // namespace

Extracted<Extraction> IdentityExtractor::extract(const RecordView& record) {
  simdjson::dom::element root;
  if (needs_json_) {
    auto parsed = parse_object(json_->parser, record, options_.max_json_bytes);
    if (!parsed) return tl::unexpected(std::move(parsed.error()));
    root = *parsed;
  }
  Extraction out;
  if (spec_.parts.size() == 1) {
    auto bytes = part_bytes(spec_.parts.front(), record, root, scratch_);
    if (!bytes) return tl::unexpected(std::move(bytes.error()));
    out.identity = *bytes;
  } else {
    composite_.clear();
    for (const auto& part : spec_.parts) {
      auto bytes = part_bytes(part, record, root, scratch_);
      if (!bytes) return tl::unexpected(std::move(bytes.error()));
      append_length_prefixed(composite_, *bytes);
    }
    out.identity = composite_;
  }
  if (time_) {
    auto time = time_at(root, time_->pointer);
    if (!time) return tl::unexpected(std::move(time.error()));
    out.time_ms = *time;
  }
  return out;
}

}  // namespace kdedup::identity
