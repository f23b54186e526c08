#pragma once
// Pipeline: the `kdedup run` service. One consumer-group member that reads
// the input topics, deduplicates each assigned partition in its own Slice and
// produces distinct records (and duplicates / dead letters when configured)
// with an idempotent producer, committing an input offset only after every
// output for it and before it was delivered (at-least-once).
//
// Threads (DESIGN.md "Architecture"):
// - the consumer thread: the one that calls run(). It polls the consumer,
//   hands records to workers in batches, serves rebalance callbacks
//   (cooperative: finish in-flight records, store their final positions,
//   release; librdkafka commits them before it rejoins) and hands
//   committable positions to librdkafka's committer, which commits every
//   commit_interval while the group is stable;
// - `threads` worker threads, each the only owner of its partitions' Slices:
//   identity -> fingerprint -> filter decision -> produce;
// - one delivery thread serving producer delivery reports into the
//   partitions' OffsetTrackers.
//
// Lifecycle: create() builds the clients (no network yet); check_topics()
// verifies topics and partition counts against the config; run() joins the
// group and processes until `stop` becomes true (graceful: finish in-flight,
// flush, commit, leave) or a fatal error happens (returned, with only
// delivered records committed). A Pipeline runs once.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/pipeline/stats.h"

namespace kdedup::pipeline {

/// Points where later stages (state snapshots, restore) plug in. Each hook
/// runs on the worker thread that owns the slice; none may block for long.
struct SliceHooks {
  /// Builds the Slice for a newly assigned partition (e.g. from a snapshot).
  /// Runs on the consumer thread during assignment. Unset: Slice::create.
  std::function<Result<std::unique_ptr<Slice>>(const PartitionId&, const SliceOptions&)> make_slice;
  /// Called after a revoked partition's outputs were delivered and its offset
  /// committed, just before the Slice is destroyed (the point to snapshot it).
  std::function<void(Slice&)> on_release;
  /// Receives each librdkafka statistics document (JSON) of the consumer and
  /// the producer. Set: the pipeline asks both clients for statistics every
  /// `statistics.interval.ms` (5000 unless `kafka` / `consumer` /
  /// `producer` set it). Runs on the thread that polls the client (the
  /// consumer thread, the delivery thread): hand the text over, do not parse
  /// it there.
  std::function<void(std::string_view)> on_statistics;
};

class Pipeline {
 public:
  /// Builds consumer and producer from `config` (librdkafka properties are
  /// checked here: an unknown or invalid property is an error naming it).
  [[nodiscard]] static Result<std::unique_ptr<Pipeline>> create(const config::Config& config,
                                                                SliceHooks hooks = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Fetches metadata and checks that every input topic, the output topic and
  /// the DLQ / duplicates topics exist, and that with `output.partitioning:
  /// input` the output topic has at least as many partitions as each input
  /// topic. Errors name the topic and say what to change.
  [[nodiscard]] Status check_topics();

  /// Runs the service until `stop` is true (then shuts down gracefully and
  /// returns success) or a fatal error (returned). Call once, from the thread
  /// that owns the Pipeline. A graceful stop waits, within shutdown_timeout,
  /// until every final position was committed (a rebalance in progress is
  /// waited out, not committed into) and, if the member never completed a
  /// group join, for that first join (librdkafka 2.0.2 aborts otherwise).
  [[nodiscard]] Status run(const std::atomic<bool>& stop);

  /// A copy of the counters; any thread, any time.
  [[nodiscard]] PipelineStats stats() const;

  struct Impl;

 private:
  explicit Pipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Turns a config into the options every Slice is built with.
[[nodiscard]] SliceOptions slice_options(const config::Config& config);

}  // namespace kdedup::pipeline
