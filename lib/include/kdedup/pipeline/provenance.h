#pragma once
// Provenance: where an output record came from. Every distinct record kdedup
// produces carries three headers (DESIGN.md "Recovery protocol"); the
// output is the record of what was delivered, so recovery, the demo's
// audit and the tests' oracle all read them back with parse_provenance():
//   kdedup-source-topic      input topic name
//   kdedup-source-partition  input partition, ASCII decimal
//   kdedup-source-offset     input offset, ASCII decimal

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

inline constexpr std::string_view kProvenanceTopicHeader = "kdedup-source-topic";
inline constexpr std::string_view kProvenancePartitionHeader = "kdedup-source-partition";
inline constexpr std::string_view kProvenanceOffsetHeader = "kdedup-source-offset";

/// The provenance header values of one output record (first occurrence of
/// each name), as found.
struct ProvenanceHeaders {
  std::optional<std::string_view> topic;
  std::optional<std::string_view> partition;
  std::optional<std::string_view> offset;

  /// Keeps `value` if `name` is one of the three and not seen yet.
  void offer(std::string_view name, std::string_view value);
};

/// Where an output record came from.
struct Provenance {
  PartitionId source;
  std::int64_t offset = 0;
};

/// Parse result: a provenance, nothing (a record kdedup did not write: no
/// provenance header at all), or an error naming the malformed header.
struct ProvenanceParse {
  std::optional<Provenance> provenance;
  std::optional<std::string> malformed;  ///< set when some header is present but unusable
};

/// Parses the three headers. All absent = not a kdedup record (neither set).
/// Partial or non-decimal values (sign, spaces, empty, overflow, negative
/// partition or offset) are malformed with a message naming the header.
[[nodiscard]] ProvenanceParse parse_provenance(const ProvenanceHeaders& headers);

}  // namespace kdedup::pipeline
