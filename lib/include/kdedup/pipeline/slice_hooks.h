#pragma once
// SliceHooks: where instrumentation (metrics, tests) plugs into `kdedup run`:
// how a partition's Slice is built, and what happens when it is released,
// recovered or snapshotted, and to the clients' statistics. Given to
// Pipeline::create(); the parts of the pipeline that call a hook (the
// workers, recovery, the snapshot writer, the clients' event callbacks)
// see only this header.

#include <functional>
#include <memory>
#include <string_view>

#include "kdedup/common/result.h"
#include "kdedup/pipeline/recovery.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/state/snapshot.h"

namespace kdedup::pipeline {

/// Points where instrumentation plugs in. None may block for long.
struct SliceHooks {
  /// Builds the Slice for a newly assigned partition from `start` (a
  /// restored filter, or none for an empty one). Runs on the consumer
  /// thread during assignment. Unset: Slice::create.
  std::function<Result<std::unique_ptr<Slice>>(const PartitionId&, const SliceOptions&, SliceStart)>
      make_slice;
  /// Called on the worker that owns a revoked partition's Slice, after its
  /// outputs were delivered and its final position stored, just before the
  /// Slice is destroyed.
  std::function<void(Slice&)> on_release;
  /// A partition's recovery finished (its replay reached the end, or there
  /// was nothing to replay). Consumer thread.
  std::function<void(const PartitionId&, const RecoveryOutcome&)> on_recovered;
  /// A snapshot write finished (written or failed). The store's writer
  /// thread; the partition may no longer be assigned.
  std::function<void(const PartitionId&, const Result<state::WriteReport>&)> on_snapshot;
  /// Receives each librdkafka statistics document (JSON) of the consumer and
  /// the producer. Set: the pipeline asks both clients for statistics every
  /// `statistics.interval.ms` (5000 unless `kafka` / `consumer` /
  /// `producer` set it). Runs on the thread that polls the client (the
  /// consumer thread, the delivery thread): hand the text over, do not parse
  /// it there.
  std::function<void(std::string_view)> on_statistics;
};

}  // namespace kdedup::pipeline
