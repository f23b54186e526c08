// The recovery of newly assigned partitions, step by step
// (partition_recovery.h).

#include "partition_recovery.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "assigned_partitions.h"
#include "kafka_errors.h"
#include "kdedup/pipeline/snapshotter.h"
#include "kdedup/state/snapshot_store.h"
#include "partition_log.h"
#include "worker.h"

namespace kdedup::pipeline {

namespace {

constexpr int kRequestTimeoutMs = 15'000;

bool plan_restores(const RecoveryPlan& plan) {
  return plan.filter == RecoveryPlan::FilterSource::kRestored;
}

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// The plan's log line: its explanation, and for a rebuild what the
/// output held.
PlanLine plan_line(const RecoveryPlan& plan, std::size_t delivered, std::size_t learned) {
  PlanLine line;
  line.warn = plan.snapshot_refusal && *plan.snapshot_refusal != SnapshotRefusal::kMissing;
  line.text = plan.explanation;
  if (plan.reason == RecoveryReason::kRebuildFromWindow) {
    line.text += fmt::format("; {} delivered records found in the output", delivered);
    if (learned != 0) {
      line.text +=
          fmt::format(", {} of them learned from the output itself (their input is gone)", learned);
    }
  }
  return line;
}

}  // namespace

ReconcileOptions RecoverySetup::reader_options() const {
  ReconcileOptions o;
  o.properties = config::consumer_properties(config);
  // The short-lived readers have no event callback to hand statistics to.
  o.properties.erase("statistics.interval.ms");
  o.tail_records = config.state.reconcile_tail_records;
  return o;
}

Recovery::Recovery(RecoverySetup& setup, std::vector<PartitionId> ids,
                   std::map<PartitionId, std::int64_t> known_committed)
    : setup_(setup), ids_(std::move(ids)), known_committed_(std::move(known_committed)) {}

Result<FetchPositions> Recovery::run() {
  if (ids_.empty()) return fetch_;
  t0_ = Clock::now();
  if (auto s = read_committed_offsets(); !s) return tl::unexpected(s.error());
  if (auto s = read_watermarks(); !s) return tl::unexpected(s.error());
  t_offsets_ = Clock::now();
  load_snapshots();
  t_snapshots_ = Clock::now();
  if (auto s = find_window_starts(); !s) return tl::unexpected(s.error());
  t_windows_ = Clock::now();
  if (auto s = read_delivered(); !s) return tl::unexpected(s.error());
  t_tail_ = Clock::now();
  for (const auto& id : ids_) {
    auto from = start_partition(id);
    if (!from) return tl::unexpected(from.error());
    fetch_[id] = *from;
  }
  log_summary();
  return fetch_;
}

// 1. The group's committed offsets, and the offsets this member committed
//    itself.
Status Recovery::read_committed_offsets() {
  std::vector<RdKafka::TopicPartition*> tps;
  for (const auto& id : ids_)
    tps.push_back(RdKafka::TopicPartition::create(id.topic, id.partition));
  const RdKafka::ErrorCode err = setup_.consumer->committed(tps, kRequestTimeoutMs);
  std::string failed;
  for (auto* tp : tps) {
    PartitionId id{tp->topic(), tp->partition()};
    if (err == RdKafka::ERR_NO_ERROR && tp->err() != RdKafka::ERR_NO_ERROR) {
      failed += (failed.empty() ? "" : ", ") + id.str() + ": " + describe_kafka_error(tp->err());
    }
    committed_[id] = tp->offset() >= 0 ? std::optional<std::int64_t>(tp->offset()) : std::nullopt;
  }
  RdKafka::TopicPartition::destroy(tps);
  if (err != RdKafka::ERR_NO_ERROR) {
    return fail("cannot read the committed offsets of " + join_partitions(ids_) + ": " +
                describe_kafka_error(err));
  }
  if (!failed.empty()) return fail("cannot read the committed offsets: " + failed);
  for (const auto& [id, offset] : known_committed_) {
    auto& c = committed_[id];
    if (!c || *c < offset) c = offset;
  }
  return {};
}

// Oldest and next offset of each partition (retention, empty partitions).
Status Recovery::read_watermarks() {
  for (const auto& id : ids_) {
    std::int64_t low = 0, high = 0;
    if (RdKafka::ErrorCode err = setup_.consumer->query_watermark_offsets(
            id.topic, id.partition, &low, &high, kRequestTimeoutMs);
        err != RdKafka::ERR_NO_ERROR) {
      return fail("cannot read the offsets of " + id.str() + ": " + describe_kafka_error(err));
    }
    marks_[id] = {low, high};
  }
  return {};
}

// 2. Snapshots.
void Recovery::load_snapshots() {
  const auto& config = setup_.config;
  const state::StateFingerprint fingerprint =
      state::state_fingerprint(config.filter, config.tick_scale(), setup_.salt_check);
  for (const auto& id : ids_) {
    Loaded& l = loaded_[id];
    if (setup_.store == nullptr || !config.filter_enabled) continue;  // kMissing
    auto r = setup_.store->load(state::PartitionKey{id.topic, id.partition}, fingerprint);
    l.offer = offer_from(r);
    if (r) {
      l.bytes = r->info.logical_bytes;
      l.filter = std::move(r->filter);
    }
  }
}

// 3. The committed positions: the timestamp of the record before C bounds
//    how old the deliveries after C can be; without a usable snapshot,
//    also where the rebuild starts: one window (and the tick after it)
//    before C.
Status Recovery::find_window_starts() {
  std::map<PartitionId, std::int64_t> positions;
  for (const auto& id : ids_) {
    const auto& c = committed_[id];
    const auto [low, high] = marks_[id];
    if (!c || *c <= low || *c - 1 >= high) continue;
    positions[id] = *c;
    const auto& snap = loaded_[id].offer.snapshot;
    const bool usable = snap && snap->next_offset <= *c && snap->next_offset >= low;
    if (!usable && setup_.config.filter_enabled) rebuild_.insert(id);
  }
  const filter::TickScale scale = setup_.config.tick_scale();
  auto points = find_commit_points(setup_.reader_options(), positions, rebuild_,
                                   scale.window_ms() + scale.tick_ms_ceil());
  if (!points) return tl::unexpected(points.error());
  points_ = std::move(*points);
  return {};
}

/// Which output partitions step 4 reads, and how far back.
struct Recovery::OutputReads {
  std::set<std::int32_t> partitions;
  std::map<std::int32_t, std::int64_t> since;  // rebuilds: back to the window start
  std::map<PartitionId, Coverage> cover;
  std::map<PartitionId, std::int64_t> gone;  // rebuilds: input below this was deleted
};

Recovery::OutputReads Recovery::output_reads() const {
  const auto& config = setup_.config;
  const std::int64_t lateness = config.state.rebuild_lateness.count();
  OutputReads reads;
  for (const auto& id : ids_) {
    const auto point = points_.find(id);
    const bool rebuilt = point != points_.end() && point->second.window_offset;
    if (!setup_.reconcile && !rebuilt) continue;
    Coverage& c = reads.cover[id];
    c.from_offset = committed_.at(id).value_or(0);
    if (rebuilt && marks_.at(id).first > 0) reads.gone[id] = marks_.at(id).first;
    if (point != points_.end()) c.since_ms = point->second.timestamp_ms - lateness;
    for (std::int32_t p : output_partitions_to_read(config.output.partitioning, id.partition,
                                                    setup_.output_partitions)) {
      reads.partitions.insert(p);
      if (!rebuilt) continue;
      const std::int64_t from = point->second.since_ms - lateness;
      auto [it, added] = reads.since.try_emplace(p, from);
      if (!added) it->second = std::min(it->second, from);
    }
  }
  return reads;
}

// 4. The output: what was delivered. Its tail for reconciliation
//    (idempotent mode: what was emitted past C), back to the window start
//    for a rebuild (less state.rebuild_lateness for records that came
//    late), and further back where a partition's uncommitted output
//    outgrew the tail (read_output).
Status Recovery::read_delivered() {
  if (!setup_.reconcile && rebuild_.empty()) return {};
  const ReconcileOptions opts = setup_.reader_options();
  if (setup_.output_partitions < 0) {
    auto n = output_partition_count(opts, setup_.config.output.topic);
    if (!n) return tl::unexpected(n.error());
    setup_.output_partitions = *n;
  }
  const OutputReads reads = output_reads();
  // Deliveries whose input record is gone cannot be replayed: their
  // identities are learned from the output record itself, at the tick of
  // its timestamp (its partition clock was at least that).
  const filter::TickScale scale = setup_.config.tick_scale();
  auto learn_gone = [&](const Provenance& p, const identity::RecordView& record, std::int64_t ts) {
    auto g = reads.gone.find(p.source);
    if (g == reads.gone.end() || p.offset >= g->second || !setup_.extractor) return;
    if (auto id = setup_.extractor->extract(record)) {
      learned_[p.source].emplace_back(scale.tick(ts), (*setup_.fingerprinter)(id->identity));
    }
  };
  auto r = read_output(opts, setup_.config.output.topic,
                       std::vector<std::int32_t>(reads.partitions.begin(), reads.partitions.end()),
                       reads.since, reads.cover,
                       reads.gone.empty() ? DeliveryVisitor() : DeliveryVisitor(learn_gone));
  if (!r) {
    return fail(r.error().message +
                "; not starting these partitions: without it records a previous owner "
                "already emitted would be emitted again, or the filter could not be rebuilt");
  }
  tail_ = std::move(*r);
  return {};
}

// 5. Plan, build the Slice, hand it to a worker.
Result<std::int64_t> Recovery::start_partition(const PartitionId& id) {
  auto plan = plan_recovery(inputs_for(id));
  if (!plan) return tl::unexpected(plan.error());
  PlanLine line;
  auto slice = build_slice(id, *plan, line);
  if (!slice) return tl::unexpected(slice.error());
  Assigned a = make_assigned(id, **slice, *plan);
  const std::optional<std::int64_t>& committed = committed_[id];
  if (committed) setup_.partitions.confirm(id, *committed);
  if (setup_.snapshotter != nullptr) setup_.snapshotter->reset(id, committed);
  a.worker = setup_.workers.adopt(std::move(*slice));
  Assigned& entry = setup_.partitions.insert(id, std::move(a));
  if (entry.restoring) {
    spdlog::log(line.warn ? spdlog::level::warn : spdlog::level::info, "{}", line.text);
  } else {
    finish_recovery(id, entry, setup_.hooks, &line);
  }
  return plan->fetch_from.value_or(RdKafka::Topic::OFFSET_INVALID);
}

RecoveryInputs Recovery::inputs_for(const PartitionId& id) {
  RecoveryInputs in;
  in.partition = id;
  in.snapshot = loaded_[id].offer;
  in.committed = committed_[id];
  // delivery: transactional reconciles nothing: aborted output is not
  // visible to read_committed readers and committed output matches C.
  if (setup_.reconcile) in.highest_emitted = tail_.highest(id);
  in.window_ms = std::max<std::int64_t>(1, setup_.config.window_ms());
  if (auto it = points_.find(id); it != points_.end()) {
    in.window_start_offset = it->second.window_offset;
  }
  in.low_watermark = marks_[id].first;
  return in;
}

/// The partition's Slice: the restored filter or an empty one (which
/// learns what only the output still knows), with the plan's ReplayRule.
Result<std::unique_ptr<Slice>> Recovery::build_slice(const PartitionId& id,
                                                     const RecoveryPlan& plan, PlanLine& line) {
  SliceStart start;
  if (plan_restores(plan)) {
    start.filter = std::move(loaded_[id].filter);
    start.clock_ms = plan.clock_ms;
    start.next_offset = plan.fetch_from.value_or(-1);
  }
  const auto& hooks = setup_.hooks;
  auto slice = hooks.make_slice ? hooks.make_slice(id, setup_.options, std::move(start))
                                : Slice::create(id, setup_.options, std::move(start));
  if (!slice) return fail("cannot set up partition " + id.str() + ": " + slice.error().message);
  const std::size_t learned = plan_restores(plan) ? 0 : learn_from_output(id, **slice);
  const auto& config = setup_.config;
  // Where quiet partitions park, one that has had no record holds no filter
  // until its first record makes it (Slice::pristine(): the filter is the
  // one make_filter() gives, made anew then), so assigning many partitions
  // does not hold a floor for each until park_after has passed.
  if (config.state.park_after.count() > 0 && (*slice)->pristine()) (*slice)->park();
  ReplayRule rule(
      plan_restores(plan) ? ReplayRule::Below::kSnapshot : ReplayRule::Below::kDelivered,
      plan.committed_until, plan.rebuild_until, tail_.emitted(id),
      config.output.partitioning == config::Partitioning::kInput,
      config.on_duplicate == config::OnDuplicate::kRefresh);
  const std::size_t delivered = rule.delivered();
  (*slice)->set_replay(std::move(rule));
  line = plan_line(plan, delivered, learned);
  return slice;
}

/// Inserts the deliveries found only in the output into a new slice's
/// filter, oldest first (the filter's clock only moves forward); returns
/// how many.
std::size_t Recovery::learn_from_output(const PartitionId& id, Slice& slice) {
  auto l = learned_.find(id);
  if (l == learned_.end()) return 0;
  auto& found = l->second;
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<filter::Fingerprint> fps;
  std::vector<filter::Tick> ticks;
  for (const auto& [tick, fp] : found) {
    ticks.push_back(tick);
    fps.push_back(fp);
  }
  std::vector<filter::Decision> out(fps.size());
  const std::vector<std::uint8_t> learn(fps.size(), 1);
  slice.decide(fps, ticks, out, learn);
  return fps.size();
}

Assigned Recovery::make_assigned(const PartitionId& id, Slice& slice, const RecoveryPlan& plan) {
  const auto [low, high] = marks_[id];
  const std::optional<std::int64_t>& committed = committed_[id];
  Assigned a;
  a.tracker = slice.tracker();
  a.counters = slice.counters();
  a.committed = committed.value_or(-1);
  a.stored = committed.value_or(-1);
  // Replay as far as the partition holds records now; a position past
  // high can only be reached by new records, which are not replayed.
  const std::int64_t from = plan.fetch_from.value_or(low);
  a.restore_end = std::min(plan.rebuild_until, high);
  a.restoring = from < a.restore_end;
  a.assigned_at = t0_;
  a.outcome.reason = plan.reason;
  a.outcome.snapshot_refusal = plan.snapshot_refusal;
  a.outcome.restored_bytes = plan_restores(plan) ? loaded_[id].bytes : 0;
  a.counters->restoring.store(a.restoring, std::memory_order_relaxed);
  return a;
}

void Recovery::log_summary() const {
  spdlog::info(
      "recovery of {} partition(s) planned in {:.0f} ms (offsets {:.0f} ms, snapshots {:.0f} ms, "
      "window starts {:.0f} ms, output {:.0f} ms for {} records{})",
      ids_.size(), ms_between(t0_, Clock::now()), ms_between(t0_, t_offsets_),
      ms_between(t_offsets_, t_snapshots_), ms_between(t_snapshots_, t_windows_),
      ms_between(t_windows_, t_tail_), tail_.records_read,
      tail_.extended == 0
          ? std::string()
          : fmt::format(", {} output partition(s) read back to the committed offsets: their "
                        "uncommitted output outgrew state.reconcile_tail_records",
                        tail_.extended));
}

void finish_recovery(const PartitionId& id, Assigned& a, const SliceHooks& hooks,
                     const PlanLine* plan) {
  a.restoring = false;
  a.counters->restoring.store(false, std::memory_order_relaxed);
  a.outcome.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - a.assigned_at).count();
  a.outcome.replayed = a.counters->replayed.load(std::memory_order_relaxed);
  const std::string done =
      fmt::format("recovery done ({}) in {:.2f} s, {} records replayed in rebuild mode",
                  to_string(a.outcome.reason), a.outcome.seconds, a.outcome.replayed);
  if (plan != nullptr) {
    spdlog::log(plan->warn ? spdlog::level::warn : spdlog::level::info, "{}; {}", plan->text, done);
  } else {
    spdlog::info("{}: {}", id.str(), done);
  }
  if (hooks.on_recovered) hooks.on_recovered(id, a.outcome);
}

void check_restored(AssignedPartitions& partitions, RdKafka::KafkaConsumer& consumer,
                    const SliceHooks& hooks) {
  std::vector<RdKafka::TopicPartition*> ask;
  for (auto& [id, a] : partitions.all()) {
    if (!a.restoring) continue;
    if (a.counters->next_offset.load(std::memory_order_relaxed) >= a.restore_end) {
      finish_recovery(id, a, hooks);
    } else if (a.counters->queued.load(std::memory_order_relaxed) == 0) {
      ask.push_back(RdKafka::TopicPartition::create(id.topic, id.partition));
    }
  }
  if (ask.empty()) return;
  if (consumer.position(ask) == RdKafka::ERR_NO_ERROR) {
    for (auto* tp : ask) {
      const PartitionId id{tp->topic(), tp->partition()};
      Assigned* a = partitions.find(id);
      if (a == nullptr || tp->err() != RdKafka::ERR_NO_ERROR) continue;
      if (a->restoring && tp->offset() >= a->restore_end &&
          a->counters->queued.load(std::memory_order_relaxed) == 0) {
        finish_recovery(id, *a, hooks);
      }
    }
  }
  RdKafka::TopicPartition::destroy(ask);
}

}  // namespace kdedup::pipeline
