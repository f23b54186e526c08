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

// The repartition stage (repartition.h) keeps the ORIGINAL input record's
// provenance under other names: the dedup stage adds kdedup-source-* naming
// the internal topic, and recovery reads the first occurrence of those.
inline constexpr std::string_view kOriginTopicHeader = "kdedup-origin-topic";
inline constexpr std::string_view kOriginPartitionHeader = "kdedup-origin-partition";
inline constexpr std::string_view kOriginOffsetHeader = "kdedup-origin-offset";

/// The names of one set of provenance headers.
struct ProvenanceNames {
  std::string_view topic, partition, offset;
};
inline constexpr ProvenanceNames kSourceProvenance{
    kProvenanceTopicHeader, kProvenancePartitionHeader, kProvenanceOffsetHeader};
inline constexpr ProvenanceNames kOriginProvenance{kOriginTopicHeader, kOriginPartitionHeader,
                                                   kOriginOffsetHeader};

/// The provenance header values of one output record (first occurrence of
/// each name), as found.
struct ProvenanceHeaders {
  std::optional<std::string_view> topic;
  std::optional<std::string_view> partition;
  std::optional<std::string_view> offset;

  /// Keeps `value` if `name` is one of the three and not seen yet.
  void offer(std::string_view name, std::string_view value,
             const ProvenanceNames& names = kSourceProvenance);
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
/// `names` only words the messages (kOriginProvenance for the
/// kdedup-origin-* headers).
[[nodiscard]] ProvenanceParse parse_provenance(const ProvenanceHeaders& headers,
                                               const ProvenanceNames& names = kSourceProvenance);

}  // namespace kdedup::pipeline
