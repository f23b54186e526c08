#pragma once
// The output oracle: judges a deduplicated output topic against the exact
// semantics of its input. The one judge of kdedup's output: the
// failure-injection tests (kill -9, corrupt snapshots, broker faults),
// `kdedup demo` and bench/pipeline_bench all use it. Independent of the
// pipeline's code: it sees only what a user could read from Kafka (and the
// one time -> tick mapping, filter::TickScale, when asked to judge the
// window edge as the filters do).
//
// The oracle (DESIGN.md "Semantics", seed 000 Definition 4 with an exact
// filter): per input topic-partition, in offset order, the partition clock is
// the largest record timestamp seen so far; a record is distinct iff no
// earlier distinct record of the same identity was delivered less than
// `window` before the clock (an age of exactly `window` is a duplicate).
// Records whose age against that earlier delivery lies in (window, window +
// one tick] are "ambiguous" (filter::TickScale: a delivery is forgotten by
// the end of the tick after the window); there the oracle follows what the
// output did, and they are never counted as lost or unexpected. With
// VerifySpec::scale the edge is judged in ticks exactly as the filters do
// (an identity delivered at tick a is a duplicate at tick n iff n - a <=
// ticks_per_window), and nothing is ambiguous.
//
// What the report counts, separately:
//   lost        oracle-distinct input records absent from the output
//   duplicated  extra copies of a source offset, and emitted records whose
//               identity was already emitted (from another offset) within
//               the window before them
//   out_of_order per output partition and source partition, a provenance
//               offset lower than one emitted before it (copies excluded:
//               those are duplicated)
//   unexpected  output records that are not oracle-distinct and not already
//               counted as duplicated: oracle duplicates that were emitted,
//               records without or with malformed provenance, provenance
//               naming no input record, key/value differing from the source
//
// Plain value functions; no shared state.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/filter/tick_scale.h"
#include "kdedup/pipeline/provenance.h"
#include "kdedup/testbroker/kafka_io.h"

namespace kdedup::testbroker {

/// One input record as produced.
struct InputRecord {
  std::string topic;
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::string identity;  ///< what the dedup identity extractor yields
  std::int64_t timestamp_ms = 0;
  std::optional<std::string> key;
  std::string value;
};

/// One output record with its provenance headers as read.
struct OutputRecord {
  std::int32_t partition = 0;  ///< output partition
  std::int64_t offset = 0;     ///< output offset
  std::optional<std::string> source_topic;
  std::optional<std::int32_t> source_partition;
  std::optional<std::int64_t> source_offset;
  std::string malformed;  ///< non-empty: why the provenance could not be parsed
  std::optional<std::string> key;
  std::string value;
};

struct VerifySpec {
  std::int64_t window_ms = 0;  ///< the configured window (> 0)
  /// Window precision: deliveries older than window + tick_ms must be
  /// forgotten; between window and window + tick_ms either decision is
  /// right. 0 = window / 64 (coarser than any default tick).
  std::int64_t tick_ms = 0;
  /// The filter's target false-positive probability; 0 = an exact filter.
  /// Above 0 the oracle's "delivered" is what the output holds (seed 000
  /// Definition 4: a copy of an identity a false positive dropped is new),
  /// and oracle-distinct records missing from the output are counted as
  /// false_positives, which may reach fp_bound, not as lost.
  double fpp = 0.0;
  /// on_duplicate: refresh: every occurrence (delivered or not) renews its
  /// identity, so a record is a duplicate iff its identity occurred within
  /// the window before it.
  bool refresh = false;
  /// Set: the window edge judged in the filters' ticks (see the file
  /// comment); window_ms and tick_ms are then not used for it.
  std::optional<filter::TickScale> scale;
  bool check_payload = true;  ///< compare output key/value to the source record
  std::size_t examples = 5;   ///< examples kept per kind
};

struct VerifyReport {
  std::size_t input_records = 0;
  std::size_t oracle_distinct = 0;
  std::size_t output_records = 0;
  std::size_t ambiguous = 0;  ///< input records within one tick of the window edge
  std::size_t lost = 0;
  std::size_t duplicated = 0;
  std::size_t out_of_order = 0;
  std::size_t unexpected = 0;
  std::size_t false_positives = 0;  ///< spec.fpp > 0: distinct records dropped
  std::size_t fp_bound = 0;         ///< most false positives accepted for spec.fpp
  /// Distinct records of a pure exact replay (each judged against the
  /// oracle's own deliveries, never against the output): the count a
  /// perfect filter would emit. Ambiguous records count as distinct.
  std::size_t exact_distinct = 0;
  std::size_t emitted_sources = 0;  ///< input records with at least one copy in the output
  std::size_t copies = 0;  ///< extra copies of a source offset (also counted in duplicated)
  std::vector<std::string> lost_examples;
  std::vector<std::string> duplicated_examples;
  std::vector<std::string> out_of_order_examples;
  std::vector<std::string> unexpected_examples;

  /// No loss, no duplicate, nothing out of order, nothing unexpected.
  [[nodiscard]] bool ok() const noexcept {
    return lost == 0 && duplicated == 0 && out_of_order == 0 && unexpected == 0 &&
           false_positives <= fp_bound;
  }
  /// Figures on one line, then up to `examples` examples of each kind.
  [[nodiscard]] std::string to_string() const;
};

/// Compares `output` with the oracle of `input`. Input records may come in
/// any order; they are judged per topic-partition in offset order.
[[nodiscard]] VerifyReport verify_output(const std::vector<InputRecord>& input,
                                         const std::vector<OutputRecord>& output,
                                         const VerifySpec& spec);

/// Input records from a topic read: identity by `extractor`, which is `key`
/// or `json:/pointer` (the value's field at that JSON Pointer, compared as
/// minified JSON). Fails naming the record whose identity cannot be
/// extracted (no key, invalid JSON, missing field).
[[nodiscard]] Result<std::vector<InputRecord>> to_input_records(
    const std::vector<KafkaRecord>& records, const std::string& extractor);

/// Output records from a topic read, provenance parsed from the headers
/// `names`: kdedup-source-* (the dedup stage's input record), or
/// kdedup-origin-* (the original input record behind the repartition stage).
[[nodiscard]] std::vector<OutputRecord> to_output_records(
    const std::vector<KafkaRecord>& records,
    const pipeline::ProvenanceNames& names = pipeline::kSourceProvenance);

/// Judges an output against the WHOLE input, every partition together: for
/// input whose copies of one identity are spread over partitions (producers
/// that do not key by identity, the repartition stage). Per identity, the
/// emitted records (found through the provenance) sorted by timestamp:
///   duplicated  an emission within `window` of the identity's previous
///               emission (a false negative), or a second copy of a source
///               offset;
///   lost        an input record with no emission of its identity within
///               `window` of its timestamp on either side (nothing
///               represents it in the output);
///   unexpected  output without provenance, naming no input record, or
///               with key/value differing from it.
/// Differences in (window, window + tick] are ambiguous (either is right;
/// VerifySpec::scale is not used here).
/// Order is not judged: copies from different partitions have no order.
/// `oracle_distinct` counts the identity's emissions an exact filter over
/// the merged input (by timestamp) makes.
[[nodiscard]] VerifyReport verify_by_identity(const std::vector<InputRecord>& input,
                                              const std::vector<OutputRecord>& output,
                                              const VerifySpec& spec);

/// The most false positives a filter at `fpp` may show over `new_records`
/// records that were new given what was emitted, without failing a check:
/// the binomial mean + 4 standard deviations + 5.
[[nodiscard]] std::uint64_t false_positive_bound(double fpp, std::uint64_t new_records);

}  // namespace kdedup::testbroker
