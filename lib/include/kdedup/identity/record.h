#pragma once
// RecordView: the parts of a record an identity can be taken from, without
// any Kafka client types, so the same extractors serve the Kafka pipeline
// (key, value and headers of a consumed message) and `kdedup filter` (one
// line of text as the value).
//
// Null and empty are different: a Kafka record may carry a null key or value
// (tombstones) and header values may be null; an empty byte string is a
// present value of length zero. Bytes are opaque: no encoding is assumed.

#include <optional>
#include <span>
#include <string_view>

namespace kdedup::identity {

/// One record header. Names may repeat; extractors use the last occurrence
/// (the convention of Kafka's Headers.lastHeader).
struct RecordHeader {
  std::string_view name;
  std::optional<std::string_view> value;  ///< nullopt = null header value
};

/// Non-owning view of one record; the caller keeps the bytes alive while an
/// extractor reads them.
struct RecordView {
  std::optional<std::string_view> key;    ///< nullopt = null key
  std::optional<std::string_view> value;  ///< nullopt = null value (tombstone)
  std::span<const RecordHeader> headers;
};

}  // namespace kdedup::identity
