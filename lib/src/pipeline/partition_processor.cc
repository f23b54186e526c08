#include "kdedup/pipeline/partition_processor.h"

namespace kdedup::pipeline {

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
                                       filter::Fingerprinter fingerprinter)
    : options_(options),
      extractor_(std::move(extractor)),
      fingerprinter_(std::move(fingerprinter)) {}

BatchResult PartitionProcessor::process(Slice& slice, std::span<const RecordIn> records,
                                        std::int64_t wall_ms, RecordSinks& sinks) {
  BatchResult result;
  // A Slice that cannot decide any more (its confirm store failed) stops the
  // partition before anything of the batch counts as processed.
  auto slice_failed = [&] {
    result.slice_failed = true;
    result.processed = 0;
    result.fail_message = *slice.failure() +
                          "; stopping without committing the records of this batch: the next "
                          "start replays them";
    return result;
  };
  if (slice.failure()) return slice_failed();
  auto& counters = *slice.counters();
  const std::size_t n = records.size();
  routes_.assign(n, Route::kOutput);
  errors_.assign(n, std::nullopt);
  replayed_.assign(n, 0);
  fps_.clear();
  ticks_.clear();
  offsets_.clear();
  learn_.clear();
  decided_.clear();
  bool any_learn = false;
  std::size_t stop_at = n;  // first record not processed (on_invalid: fail)

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
        any_learn |= learn;
        decided_.push_back(i);
      }
      continue;
    }
    // An invalid record already handled by the previous owner: nothing to
    // route again (and on_invalid: fail must not stop on it).
    if (replayed) continue;
    counters.invalid.fetch_add(1, std::memory_order_relaxed);
    counters.count_invalid_reason(identity::to_string(extracted.error().reason));
    errors_[i] = std::move(extracted.error());
    switch (options_.on_invalid) {
      case config::OnInvalid::kDlq:
        routes_[i] = Route::kDeadLetter;
        break;
      case config::OnInvalid::kPass:
        counters.invalid_passed.fetch_add(1, std::memory_order_relaxed);
        routes_[i] = Route::kOutput;  // distinct, never inserted in the filter
        break;
      case config::OnInvalid::kDrop:
        counters.invalid_dropped.fetch_add(1, std::memory_order_relaxed);
        routes_[i] = Route::kNone;
        break;
      case config::OnInvalid::kFail:
        // The records before it go out, so their offsets commit.
        result.fail_message = "on_invalid is 'fail' and the record at " + slice.id().str() + "@" +
                              std::to_string(r.offset) +
                              " has no identity: " + errors_[i]->message + " (" +
                              identity::to_string(errors_[i]->reason) +
                              "); its offset is not committed. Fix the record or choose "
                              "on_invalid: dlq | pass | drop";
        result.fail_error = errors_[i];
        stop_at = i;
        break;
    }
    if (stop_at != n) break;
  }

  // One filter call for the batch. Fingerprints of records after a fail stop
  // were never collected, so the filter only learns records that are
  // processed.
  if (!fps_.empty()) {
    decisions_.resize(fps_.size());
    slice.decide(
        fps_, ticks_, decisions_,
        any_learn ? std::span<const std::uint8_t>(learn_) : std::span<const std::uint8_t>(),
        offsets_);
    if (slice.failure()) return slice_failed();
    for (std::size_t v = 0; v < decided_.size(); ++v) {
      if (decisions_[v] == filter::Decision::kDuplicate && !replayed_[decided_[v]]) {
        routes_[decided_[v]] = Route::kDuplicate;
      }
    }
  }

  // Register every processed record before anything is handed to the sinks.
  processed_.clear();
  std::uint64_t distinct = 0, duplicates = 0, dead = 0, replayed = 0;
  for (std::size_t i = 0; i < stop_at; ++i) {
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
    processed_.push_back({records[i].offset, outputs});
  }
  counters.records_in.fetch_add(stop_at - replayed, std::memory_order_relaxed);
  if (replayed != 0) counters.replayed.fetch_add(replayed, std::memory_order_relaxed);
  counters.distinct.fetch_add(distinct, std::memory_order_relaxed);
  counters.duplicates.fetch_add(duplicates, std::memory_order_relaxed);
  counters.dead_lettered.fetch_add(dead, std::memory_order_relaxed);
  result.processed = stop_at;
  if (!slice.tracker()->add(processed_)) {
    result.offsets_rejected = true;
    return result;
  }
  if (stop_at > 0) slice.set_processed(records[stop_at - 1].offset);

  for (std::size_t i = 0; i < stop_at && !sinks.stopped(); ++i) {
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
  return result;
}

}  // namespace kdedup::pipeline
