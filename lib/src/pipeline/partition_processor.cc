#include "kdedup/pipeline/partition_processor.h"

#include <utility>

namespace kdedup::pipeline {

namespace {

// A Slice that cannot decide any more (confirmed mode: its confirm store
// failed) stops the partition before anything of the batch counts as
// processed: nothing registered, nothing handed out, nothing committed.
BatchResult stop_failed(const Slice& slice, BatchResult result) {
  result.slice_failed = true;
  result.processed = 0;
  result.fail_message = *slice.failure() +
                        "; stopping without committing the records of this batch: the next "
                        "start replays them";
  return result;
}

}  // namespace

ProcessorOptions ProcessorOptions::of(const config::Config& config) {
  ProcessorOptions o;
  o.filter_enabled = config.filter_enabled;
  o.on_invalid = config.on_invalid;
  o.route_duplicates = !config.duplicates_topic.empty();
  o.refresh = config.on_duplicate == config::OnDuplicate::kRefresh;
  return o;
}

PartitionProcessor::PartitionProcessor(ProcessorOptions options,
                                       identity::IdentityExtractor extractor,
                                       const filter::Fingerprinter& fingerprinter)
    : options_(options), extractor_(std::move(extractor)), fingerprinter_(fingerprinter) {}

BatchResult PartitionProcessor::process(Slice& slice, std::span<const RecordIn> records,
                                        std::int64_t wall_ms, RecordSinks& sinks) {
  BatchResult result;
  if (slice.failure()) return stop_failed(slice, std::move(result));
  const std::size_t stop_at = classify(slice, records, wall_ms, result);
  if (!decide(slice)) return stop_failed(slice, std::move(result));
  result.processed = stop_at;
  if (!register_processed(slice, records.first(stop_at))) {
    result.offsets_rejected = true;
    return result;
  }
  hand_out(stop_at, sinks);
  return result;
}

// Steps 1-2: the replay rule, the clock, the identity of each record, and
// the fingerprints the filter is asked about. Returns the first record not
// processed (n, or the record on_invalid: fail stops at).
std::size_t PartitionProcessor::classify(Slice& slice, std::span<const RecordIn> records,
                                         std::int64_t wall_ms, BatchResult& result) {
  const std::size_t n = records.size();
  routes_.assign(n, Route::kOutput);
  errors_.assign(n, std::nullopt);
  replayed_.assign(n, 0);
  fps_.clear();
  ticks_.clear();
  offsets_.clear();
  learn_.clear();
  decided_.clear();
  any_learn_ = false;

  // Replayed records (recovery, ReplayRule): the filter decides or learns
  // them (or only the clock moves), but nothing is produced and they are
  // not input.
  const ReplayRule& rule = slice.replay();
  const bool any_replay = n > 0 && records.front().offset < rule.end();
  for (std::size_t i = 0; i < n; ++i) {
    const RecordIn& r = records[i];
    const ReplayRule::Action replay =
        any_replay ? rule.action(r.offset) : ReplayRule::Action::kProcess;
    const bool replayed =
        replay != ReplayRule::Action::kProcess && replay != ReplayRule::Action::kDropped;
    if (replayed) {
      replayed_[i] = 1;
      routes_[i] = Route::kNone;
    }
    std::optional<filter::Tick> tick;
    if (!options_.time_from_extractor) tick = slice.observe(r.timestamp_ms, wall_ms);
    // Not delivered by the previous owner: nothing for the filter to learn.
    if (replay == ReplayRule::Action::kSkip) continue;

    auto extracted = extractor_.extract(r.view);
    if (extracted && options_.time_from_extractor) {
      tick = slice.observe(extracted->time_ms.value_or(0), wall_ms);
    }
    if (extracted) {
      const bool dropped = replay == ReplayRule::Action::kDropped;
      if (dropped) {
        // The previous owner dropped it; the filter is not asked again
        // (under refresh its drop renewed the identity: learned below).
        routes_[i] = Route::kDuplicate;
        if (!options_.refresh) continue;
      }
      if (options_.filter_enabled) {
        fps_.push_back(fingerprinter_(extracted->identity));
        ticks_.push_back(*tick);
        offsets_.push_back(r.offset);
        const bool learn = replay == ReplayRule::Action::kLearn || dropped;
        learn_.push_back(learn ? 1 : 0);
        any_learn_ |= learn;
        decided_.push_back(i);
      }
      continue;
    }
    // An invalid record already handled by the previous owner: nothing to
    // route again (and on_invalid: fail must not stop on it).
    if (replayed) continue;
    if (!route_invalid(slice, r.offset, i, std::move(extracted.error()), result)) return i;
  }
  return n;
}

// on_invalid for record `i`, which has no identity; false when it stops the
// batch there (on_invalid: fail).
bool PartitionProcessor::route_invalid(Slice& slice, std::int64_t offset, std::size_t i,
                                       identity::ExtractError error, BatchResult& result) {
  auto& counters = *slice.counters();
  counters.invalid.fetch_add(1, std::memory_order_relaxed);
  counters.count_invalid_reason(identity::to_string(error.reason));
  errors_[i] = std::move(error);
  switch (options_.on_invalid) {
    case config::OnInvalid::kDlq:
      routes_[i] = Route::kDeadLetter;
      return true;
    case config::OnInvalid::kPass:
      counters.invalid_passed.fetch_add(1, std::memory_order_relaxed);
      routes_[i] = Route::kOutput;  // distinct, never inserted in the filter
      return true;
    case config::OnInvalid::kDrop:
      counters.invalid_dropped.fetch_add(1, std::memory_order_relaxed);
      routes_[i] = Route::kNone;
      return true;
    case config::OnInvalid::kFail:
      // The records before it go out, so their offsets commit.
      result.fail_message = "on_invalid is 'fail' and the record at " + slice.id().str() + "@" +
                            std::to_string(offset) + " has no identity: " + errors_[i]->message +
                            " (" + identity::to_string(errors_[i]->reason) +
                            "); its offset is not committed. Fix the record or choose "
                            "on_invalid: dlq | pass | drop";
      result.fail_error = errors_[i];
      return false;
  }
  return true;
}

// Step 3: one filter call for the batch. Fingerprints of records after a
// fail stop were never collected, so the filter only learns records that
// are processed. In confirmed mode the Slice confirms the filter's
// duplicates under the records' offsets; false when it failed to (the
// batch must not go out).
bool PartitionProcessor::decide(Slice& slice) {
  if (fps_.empty()) return true;
  decisions_.resize(fps_.size());
  slice.decide(fps_, ticks_, decisions_,
               any_learn_ ? std::span<const std::uint8_t>(learn_) : std::span<const std::uint8_t>(),
               offsets_);
  if (slice.failure()) return false;
  for (std::size_t v = 0; v < decided_.size(); ++v) {
    if (decisions_[v] == filter::Decision::kDuplicate && !replayed_[decided_[v]]) {
      routes_[decided_[v]] = Route::kDuplicate;
    }
  }
  return true;
}

// Step 5: counts, and every processed record registered with the
// OffsetTracker before anything is handed to the sinks. False when the
// tracker refused the offsets.
bool PartitionProcessor::register_processed(Slice& slice, std::span<const RecordIn> processed) {
  auto& counters = *slice.counters();
  processed_.clear();
  std::uint64_t distinct = 0, duplicates = 0, dead = 0, replayed = 0;
  for (std::size_t i = 0; i < processed.size(); ++i) {
    std::uint32_t outputs = 0;
    if (replayed_[i]) {
      ++replayed;
    } else {
      switch (routes_[i]) {
        case Route::kOutput:
          outputs = 1;
          if (!errors_[i]) ++distinct;
          break;
        case Route::kDuplicate:
          ++duplicates;
          outputs = options_.route_duplicates ? 1 : 0;
          break;
        case Route::kDeadLetter:
          ++dead;
          outputs = 1;
          break;
        case Route::kNone:
          break;
      }
    }
    processed_.push_back({processed[i].offset, outputs});
  }
  counters.records_in.fetch_add(processed.size() - replayed, std::memory_order_relaxed);
  if (replayed != 0) counters.replayed.fetch_add(replayed, std::memory_order_relaxed);
  counters.distinct.fetch_add(distinct, std::memory_order_relaxed);
  counters.duplicates.fetch_add(duplicates, std::memory_order_relaxed);
  counters.dead_lettered.fetch_add(dead, std::memory_order_relaxed);
  if (!slice.tracker()->add(processed_)) return false;
  if (!processed.empty()) slice.set_processed(processed.back().offset);
  return true;
}

// Step 6: the outputs to the sinks, in input order.
void PartitionProcessor::hand_out(std::size_t count, RecordSinks& sinks) {
  for (std::size_t i = 0; i < count && !sinks.stopped(); ++i) {
    switch (routes_[i]) {
      case Route::kOutput:
        sinks.output(i);
        break;
      case Route::kDuplicate:
        if (options_.route_duplicates) sinks.duplicate(i);
        break;
      case Route::kDeadLetter:
        sinks.dead_letter(i, *errors_[i]);
        break;
      case Route::kNone:
        break;
    }
  }
}

}  // namespace kdedup::pipeline
