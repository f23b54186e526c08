#pragma once
// The repartition stage (`repartition:` in the config): for producers that
// do not key their records by the dedup identity.
//
// kdedup deduplicates each partition on its own (one horizontal slice per
// partition, seed 000 §3), so copies of one identity must share a
// partition. The repartition stage reads the input topics in its own
// consumer group and re-produces every record to an internal topic of
// `repartition.partitions` partitions, choosing the partition from the
// identity's salted fingerprint: that choice is the horizontal slice
// function H_S of seed 000 §3 (Definition 1). The dedup stage (the existing
// Pipeline, dedup_stage() of the config) then consumes the internal topic.
//
// Each re-produced record keeps key, value, headers and timestamp and gains
// the original record's provenance as kdedup-origin-topic / -partition /
// -offset: names different from the kdedup-source-* headers, which the
// dedup stage adds naming the internal topic (recovery reads the FIRST
// occurrence of each kdedup-source-* header, so the two must not share a
// name).
//
// Delivery is at-least-once: an input offset is stored for librdkafka's
// committer only after the internal topic acknowledged its record and every
// record before it (OffsetTracker). A crash between produce and commit
// re-produces records; their copies have the same identity, land in the
// same slice and are removed by the dedup stage like any duplicate.
//
// Records without identity follow `on_invalid` here: dlq (dead-letter topic
// with kdedup-error headers and kdedup-source-* naming the input record),
// drop (counted), fail (the stage stops; the record is not committed),
// pass (forwarded to the internal topic at input partition mod N, where the
// dedup stage passes it again).
//
// Threads: run() is the stage's consumer thread (poll, extract, produce,
// rebalance callbacks, offset stores); one delivery thread serves the
// producer's delivery reports into the partitions' OffsetTrackers. stats()
// may be called from any thread. A Repartitioner runs once.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/pipeline/provenance.h"

namespace kdedup::pipeline {

// kOriginTopicHeader, kOriginPartitionHeader, kOriginOffsetHeader:
// provenance.h (one definition of every provenance header).

/// H_S of seed 000 §3: the slice (internal partition, 0..partitions-1) of an
/// identity with fingerprint `fp`. Both fingerprint halves are mixed again
/// first, so the slice is independent of the probe positions the filters
/// take from the same fingerprint (records of one slice still spread over
/// every filter cell). `partitions` must be >= 1.
[[nodiscard]] std::int32_t slice_of(const filter::Fingerprint& fp,
                                    std::int32_t partitions) noexcept;

/// Counters of the stage since it started; copies, any thread.
struct RepartitionStats {
  std::uint64_t in = 0;             ///< records read from the input topics
  std::uint64_t repartitioned = 0;  ///< acknowledged by the internal topic
  std::uint64_t dead_lettered = 0;  ///< on_invalid: dlq, acknowledged
  std::uint64_t dropped = 0;        ///< on_invalid: drop
  std::uint64_t passed = 0;         ///< on_invalid: pass, forwarded
  std::uint64_t delivery_errors = 0;
  std::int64_t lag = 0;  ///< high watermark - position, summed over assigned partitions
  std::int64_t assigned = 0;
  std::int64_t rebalances = 0;
};

class Repartitioner {
 public:
  /// Builds the consumer (group repartition_group(config)) and the
  /// idempotent producer; nothing connects yet. Fails on an invalid
  /// librdkafka property (naming it) or when the config has no repartition.
  [[nodiscard]] static Result<std::unique_ptr<Repartitioner>> create(const config::Config& config);
  ~Repartitioner();
  Repartitioner(const Repartitioner&) = delete;
  Repartitioner& operator=(const Repartitioner&) = delete;

  /// Checks the input (and dead-letter) topics exist, then the internal
  /// topic: created with repartition.partitions partitions when missing and
  /// repartition.create_topic allows it, else it must exist; an existing one
  /// with another partition count is refused (an error naming
  /// repartition.partitions: the slices would not match the dedup stage's
  /// state). Errors say what to change.
  [[nodiscard]] Status prepare_topics();

  /// Runs until `stop` is true (graceful: the in-flight records are
  /// acknowledged, their offsets committed, the group left; success) or a
  /// fatal error (returned; only acknowledged records are committed).
  [[nodiscard]] Status run(const std::atomic<bool>& stop);

  [[nodiscard]] RepartitionStats stats() const;

  struct Impl;

 private:
  explicit Repartitioner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdedup::pipeline
