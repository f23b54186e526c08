// The worker threads and the consumer thread's WorkerPool (worker.h).

#include "worker.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "fatal_error.h"
#include "free_memory.h"
#include "kafka_clients.h"
#include "kafka_errors.h"
#include "kdedup/pipeline/snapshotter.h"
#include "kdedup/state/snapshot.h"
#include "kdedup/state/snapshot_store.h"

namespace kdedup::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

/// The producer as the processor's sinks, for one batch of one partition.
class Worker::ProducerSinks final : public RecordSinks {
 public:
  ProducerSinks(Worker& worker, Slice& slice, std::span<MessagePtr> records)
      : worker_(worker), slice_(slice), records_(records) {}
  void output(std::size_t i) override {
    const auto& cfg = worker_.context_.config;
    const std::int32_t partition = cfg.output.partitioning == config::Partitioning::kInput
                                       ? records_[i]->partition
                                       : RdKafka::Topic::PARTITION_UA;
    if (produce(i, cfg.output.topic, partition, "output", nullptr)) {
      worker_.observe_emit_age(*records_[i]);
    }
  }
  void duplicate(std::size_t i) override {
    produce(i, worker_.context_.config.duplicates_topic, RdKafka::Topic::PARTITION_UA, "duplicates",
            nullptr);
  }
  void dead_letter(std::size_t i, const identity::ExtractError& error) override {
    produce(i, worker_.context_.config.dlq_topic, RdKafka::Topic::PARTITION_UA, "dead-letter",
            &error);
  }
  [[nodiscard]] bool stopped() const override { return worker_.context_.fatal.raised(); }

 private:
  bool produce(std::size_t i, const std::string& topic, std::int32_t partition,
               const char* destination, const identity::ExtractError* error) {
    const auto produced =
        worker_.output_.produce(slice_, *records_[i], topic, partition, destination, error);
    if (produced == OutputProducer::Produced::kStopped) worker_.failed_ = true;
    return produced == OutputProducer::Produced::kQueued;
  }

  Worker& worker_;
  Slice& slice_;
  std::span<MessagePtr> records_;
};

Worker::Worker(std::uint32_t index, const WorkerContext& context,
               identity::IdentityExtractor extractor)
    : index_(index),
      context_(context),
      reads_headers_(extractor.spec().reads_headers()),
      processor_(ProcessorOptions::of(context.config), std::move(extractor), context.fingerprinter),
      output_(context.producer, context.protocol, context.fatal, context.config.output.topic) {}

void Worker::start() {
  thread_ = std::thread([this] { loop(); });
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::push(Work work) {
  if (work.kind == Work::Kind::kRecords) {
    queued_records_.fetch_add(work.records.size(), std::memory_order_relaxed);
  }
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void Worker::barrier(Work::Kind kind, std::vector<PartitionId> partitions,
                     std::vector<PartitionId> capture) {
  Work w;
  w.kind = kind;
  w.partitions = std::move(partitions);
  w.capture = std::move(capture);
  w.done = std::make_shared<std::promise<void>>();
  auto fut = w.done->get_future();
  push(std::move(w));
  fut.wait();
}

void Worker::open_inbox(RdKafka::KafkaConsumer& consumer) {
  consumer_ = &consumer;
  inbox_ = rd_kafka_queue_new(consumer.c_ptr());
  // One take from the inbox: batch_size records, at most kMaxInboxTake (a
  // buffer per worker: 1,024 workers with batch_size 1,000,000 would hold
  // 8 GB of pointers).
  constexpr std::size_t kMaxInboxTake = 1024;
  inbox_batch_.resize(std::clamp<std::size_t>(context_.config.batch_size, 1, kMaxInboxTake));
  rd_kafka_queue_cb_event_enable(inbox_, &Worker::on_inbox_event, this);
}

void Worker::close_inbox() noexcept {
  if (inbox_ == nullptr) return;
  rd_kafka_queue_cb_event_enable(inbox_, nullptr, nullptr);
  // Records still there are not processed: not committed, read again.
  for (;;) {
    const ssize_t n =
        rd_kafka_consume_batch_queue(inbox_, 0, inbox_batch_.data(), inbox_batch_.size());
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) rd_kafka_message_destroy(inbox_batch_[i]);
  }
  rd_kafka_queue_destroy(inbox_);
  inbox_ = nullptr;
}

void Worker::on_inbox_event(rd_kafka_t* /*rk*/, void* opaque) {
  auto* self = static_cast<Worker*>(opaque);
  {
    std::lock_guard lock(self->mu_);
    self->inbox_ready_ = true;
  }
  self->cv_.notify_one();
}

bool Worker::take_inbox(Work& work) {
  if (inbox_ == nullptr) return false;
  const ssize_t n =
      rd_kafka_consume_batch_queue(inbox_, 0, inbox_batch_.data(), inbox_batch_.size());
  if (n < 0) {
    context_.fatal.set("consumer: " + describe_kafka_error(
                                          static_cast<RdKafka::ErrorCode>(rd_kafka_last_error())));
    return false;
  }
  if (n == 0) return false;
  if (static_cast<std::size_t>(n) == inbox_batch_.size()) {
    std::lock_guard lock(mu_);
    inbox_ready_ = true;  // more may wait
  }
  work.kind = Work::Kind::kRecords;
  work.from_inbox = true;
  work.records.reserve(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    MessagePtr m(inbox_batch_[i]);
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      work.records.push_back(std::move(m));
      continue;
    }
    // A partition's error (the consumer's own come through its queue).
    const char* topic = m->rkt != nullptr ? rd_kafka_topic_name(m->rkt) : "";
    static_cast<void>(classify_consumed(static_cast<RdKafka::ErrorCode>(m->err), topic, *consumer_,
                                        context_.fatal, "consumer"));
  }
  queued_records_.fetch_add(work.records.size(), std::memory_order_relaxed);
  return true;
}

void Worker::loop() {
  for (;;) {
    Work work;
    const bool got = next(work);
    check_slices();
    if (!got) continue;
    switch (work.kind) {
      case Work::Kind::kRecords: {
        auto started = Clock::now();
        if (!failed_) process(work.records, work.from_inbox);
        queued_records_.fetch_sub(work.records.size(), std::memory_order_relaxed);
        busy_nanos_.fetch_add(static_cast<std::uint64_t>((Clock::now() - started).count()),
                              std::memory_order_relaxed);
        break;
      }
      case Work::Kind::kAdopt: {
        PartitionId id = work.slice->id();
        slices_[id] = std::move(work.slice);
        break;
      }
      case Work::Kind::kClose:
        close(work);
        work.done->set_value();
        break;
      case Work::Kind::kRelease:
      case Work::Kind::kDrop:
        release(work);
        work.done->set_value();
        break;
      case Work::Kind::kCapture:
        for (auto& [id, slice] : slices_) capture(*slice);
        for (auto& [id, slice] : closed_) capture(*slice);
        work.done->set_value();
        break;
      case Work::Kind::kBarrier:
        work.done->set_value();
        break;
      case Work::Kind::kStop:
        output_.release_topics();
        return;
    }
  }
}

/// The next work item, or false when none came within the idle check.
bool Worker::next(Work& work) {
  // How often an idle worker runs its checks (check_slices()).
  constexpr auto kIdleCheck = std::chrono::milliseconds(250);
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, kIdleCheck, [&] { return !queue_.empty() || inbox_ready_; })) {
    return false;
  }
  if (!queue_.empty()) {
    work = std::move(queue_.front());
    queue_.pop_front();
    return true;
  }
  inbox_ready_ = false;
  lock.unlock();
  return take_inbox(work);
}

void Worker::check_slices() {
  // Once a second, busy or idle: slices that got no batch for a while
  // lower their filter's memory demand, and each filter reports what its
  // last batch left unreported (Slice::check_quiet()); a snapshot that
  // came due without new records is taken (a partition that went quiet
  // after a burst: also while other work keeps the worker from idling,
  // as the transactions' barriers do); quiet slices park. A scan of the
  // worker's slices, a few nanoseconds each unless a batch came.
  constexpr auto kEvery = std::chrono::seconds(1);
  const auto now = Clock::now();
  if (now - quiet_checked_ < kEvery) return;
  quiet_checked_ = now;
  const std::int64_t wall_ms = wall_ns() / 1'000'000;
  bool parked = false;
  for (auto& [id, slice] : slices_) {
    slice->check_quiet(wall_ms);
    if (!failed_ && slice->captures().records_since > 0) maybe_capture(*slice, 0);
    const bool covered = snapshot_covers(*slice);
    slice->counters()->snapshot_current.store(covered, std::memory_order_relaxed);
    parked = maybe_park(*slice, wall_ms, covered) || parked;
  }
  // Freed filters' pages stay resident until the allocator is told.
  if (parked) return_freed_memory();
  settle_budget(wall_ms);
}

/// Parks a slice quiet for state.park_after whose stored snapshot covers
/// it (`covered`, snapshot_covers(): a failed write stops the service
/// first), or that is pristine (nothing to read back: with or without a
/// state dir). A recovering slice with a snapshot parks once its replay is
/// over.
bool Worker::maybe_park(Slice& slice, std::int64_t wall_ms, bool covered) {
  const auto park_after = context_.config.state.park_after.count();
  if (park_after <= 0) return false;
  // No filter: passthrough, or parked already.
  if (failed_ || slice.filter() == nullptr || context_.fatal.raised()) return false;
  if (slice.quiet_for(wall_ms) < park_after) return false;
  const std::int64_t next = slice.next_offset();
  if (!slice.pristine() &&
      (!covered || context_.store == nullptr || next < 0 || next < slice.replay().end())) {
    return false;
  }
  if (!slice.park()) return false;
  spdlog::debug("worker {}: parked {} at offset {} (quiet for {} ms)", index_, slice.id().str(),
                next, slice.quiet_for(wall_ms));
  return true;
}

/// Whether the slice's stored snapshot holds its filter exactly as it
/// stands: captured at its current position (no record since) and
/// written (none of its captures waiting or in flight).
bool Worker::snapshot_covers(const Slice& slice) const {
  return context_.snapshotter != nullptr && slice.captures().last_offset == slice.next_offset() &&
         !context_.snapshotter->busy(slice.id());
}

/// Reads a parked slice's filter back from its snapshot, or makes a
/// pristine one anew. A snapshot that cannot be read, or that no longer
/// matches the slice, stops the service without committing the records
/// that came (the next start recovers the partition as after any stop).
bool Worker::unpark(Slice& slice) {
  auto stop = [&](const char* how, const std::string& why) {
    failed_ = true;
    context_.fatal.set(fmt::format(
        "{}: its parked filter cannot be {}: {}; stopping without committing its new records "
        "(the next start recovers the partition)",
        slice.id().str(), how, why));
    return false;
  };
  if (slice.pristine()) {
    if (auto made = slice.unpark_new(); !made) return stop("made anew", made.error().message);
    spdlog::debug("worker {}: unparked {} (a new filter)", index_, slice.id().str());
    return true;
  }
  const auto started = Clock::now();
  const state::PartitionKey key{slice.id().topic, slice.id().partition};
  auto loaded = context_.store->load(key, context_.fingerprint);
  std::string why;
  if (!loaded) {
    why = loaded.error().message;
  } else if (loaded->info.next_offset != slice.next_offset() ||
             loaded->info.clock_ms != slice.clock().now_ms()) {
    why = fmt::format("it was taken at offset {} and clock {}, the partition is at {} and {}",
                      loaded->info.next_offset, loaded->info.clock_ms, slice.next_offset(),
                      slice.clock().now_ms());
  }
  if (!why.empty()) return stop("read back from state.dir", why);
  const std::uint64_t bytes = loaded->info.logical_bytes;
  slice.unpark(std::move(loaded->filter));
  spdlog::debug("worker {}: unparked {} ({} bytes in {:.3f} ms)", index_, slice.id().str(), bytes,
                std::chrono::duration<double, std::milli>(Clock::now() - started).count());
  return true;
}

void Worker::settle_budget(std::int64_t wall_ms) {
  // The filters vote on the budget's level once per tick of their clocks,
  // which are event time: they stand still on a partition without records.
  // Once the load fell to nothing, no filter would vote again and the level
  // would stay raised (a process whose every partition went quiet after a
  // burst). The worker votes too, by the wall clock, once a second, under
  // the same rule: a step down only after an eighth of a window of wall
  // time at the level it saw, and only while the published demand fits.
  if (!context_.memory) return;
  const auto window_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(
      context_.config.window_ms(), std::numeric_limits<std::uint32_t>::max()));
  budget_level_.follow(*context_.memory, static_cast<std::uint64_t>(wall_ms), window_ms);
}

void Worker::close(const Work& work) {
  for (const auto& id : work.partitions) {
    if (auto it = slices_.find(id); it != slices_.end()) {
      closed_[id] = std::move(it->second);
      slices_.erase(it);
    }
  }
}

void Worker::release(Work& work) {
  for (const auto& id : work.partitions) {
    auto* owner = &closed_;
    auto it = closed_.find(id);
    if (it == closed_.end()) {
      owner = &slices_;
      it = slices_.find(id);
      if (it == slices_.end()) continue;
    }
    if (work.kind == Work::Kind::kRelease) {
      // The final snapshot, at the final stored position: librdkafka
      // commits it once the rebalance callback returned, and the commit
      // result releases the capture to the store.
      if (std::find(work.capture.begin(), work.capture.end(), id) != work.capture.end()) {
        capture(*it->second);
      }
      if (context_.hooks.on_release) context_.hooks.on_release(*it->second);
    }
    owner->erase(it);
  }
}

/// Processes one batch: records are grouped by partition (keeping each
/// partition's order) and each group goes through its Slice.
void Worker::process(std::vector<MessagePtr>& records, bool from_inbox) {
  std::size_t begin = 0;
  while (begin < records.size()) {
    // Consecutive records of one partition form a group; the consumer hands
    // out records per partition in runs, so groups are usually long.
    std::size_t end = begin + 1;
    // Same topic = same topic handle: no name copies per record.
    const rd_kafka_message_t* head = records[begin].get();
    while (end < records.size() && records[end]->partition == head->partition &&
           records[end]->rkt == head->rkt) {
      ++end;
    }
    PartitionId id{rd_kafka_topic_name(head->rkt), head->partition};
    auto it = slices_.find(id);
    if (it == slices_.end()) {
      // Closed or revoked between fetch and processing: not committed, so
      // the new owner reads it again.
      spdlog::debug("worker {}: skipping {} records of unowned partition {}", index_, end - begin,
                    id.str());
    } else {
      process_partition(*it->second, std::span(records).subspan(begin, end - begin));
      if (!from_inbox) {
        it->second->counters()->queued.fetch_sub(static_cast<std::int64_t>(end - begin),
                                                 std::memory_order_relaxed);
      }
      if (failed_) return;
      maybe_capture(*it->second, end - begin);
    }
    begin = end;
  }
}

void Worker::process_partition(Slice& slice, std::span<MessagePtr> records) {
  if (slice.parked() && !unpark(slice)) return;
  auto started = Clock::now();
  auto& counters = *slice.counters();
  emit_ages_ = {};
  ProducerSinks sinks(*this, slice, records);
  batch_wall_ns_ = wall_ns();
  slice.active(batch_wall_ns_ / 1'000'000);
  const BatchResult r = processor_.process(slice, batch_view_.of(records, reads_headers_),
                                           batch_wall_ns_ / 1'000'000, sinks);
  if (r.offsets_rejected) {
    context_.fatal.set("internal error: offsets of " + slice.id().str() +
                       " went backwards; stopping without committing them");
    failed_ = true;
    return;
  }
  if (r.fail_message) {
    failed_ = true;
    context_.fatal.set(*r.fail_message);
  }
  publish_filter_stats(slice);
  // Latency histograms: a handful of relaxed adds per batch, never per
  // record (the StatsBridge turns them into Prometheus observations).
  counters.emit_ages.add(emit_ages_);
  counters.batch_times.observe(static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count()));
}

/// Takes a snapshot capture of `slice` at its current position when one
/// is due (state.snapshot_interval or snapshot_records since the last) and
/// none of that partition is waiting or being written.
void Worker::maybe_capture(Slice& slice, std::size_t records) {
  if (context_.snapshotter == nullptr || slice.filter() == nullptr) return;
  auto& schedule = slice.captures();
  schedule.records_since += records;
  const auto& state = context_.config.state;
  if (schedule.records_since < state.snapshot_records &&
      Clock::now() - schedule.last_time < state.snapshot_interval) {
    return;
  }
  if (context_.snapshotter->busy(slice.id())) return;
  capture(slice);
}

/// Copies the slice's state into a capture for the Snapshotter (the only
/// snapshot work on the worker: one serialization of the filter). Skipped
/// when nothing changed since the last capture.
void Worker::capture(Slice& slice) {
  if (context_.snapshotter == nullptr || slice.filter() == nullptr) return;
  auto& schedule = slice.captures();
  const std::int64_t next = slice.next_offset();
  schedule.records_since = 0;
  schedule.last_time = Clock::now();
  if (next < 0 || next == schedule.last_offset) return;
  schedule.last_offset = next;
  // serialize() of the AuditedFilter is the inner filter's state.
  state::SnapshotCapture c = state::capture_snapshot(
      state::PartitionKey{slice.id().topic, slice.id().partition}, *slice.filter(), slice.scale(),
      next, slice.clock().now_ms(), context_.salt_check);
  spdlog::debug("captured {} at offset {} ({} bytes in {:.3f} ms)", slice.id().str(), next,
                c.state.size(), static_cast<double>(c.capture_time.count()) / 1e6);
  context_.snapshotter->offer(std::move(c));
}

/// The filter's size and fpp estimate into the partition's counters, at
/// most once a second per partition (stats() walks the sub-filters).
void Worker::publish_filter_stats(Slice& slice) {
  const auto* f = slice.filter();
  if (f == nullptr) return;
  auto& schedule = slice.captures();
  const auto now = Clock::now();
  if (now - schedule.last_stats < std::chrono::seconds(1)) return;
  schedule.last_stats = now;
  auto& counters = *slice.counters();
  const auto fs = f->stats();
  counters.filter_bytes.store(fs.bytes, std::memory_order_relaxed);
  counters.filter_subfilters.store(fs.subfilters, std::memory_order_relaxed);
  counters.filter_fpp_estimate.store(fs.fpp_estimate, std::memory_order_relaxed);
}

/// Adds the age at emit of an output record just handed to the producer
/// (the batch's wall clock minus its timestamp: a batch takes well under a
/// millisecond, and one clock read per record cost more than the rest of
/// this) to this batch's counts. Records without a usable timestamp leave
/// with the production time and are not observed; a timestamp in the future
/// counts as age 0.
void Worker::observe_emit_age(const rd_kafka_message_t& m) noexcept {
  const std::int64_t ts = timestamp_ms(m);
  if (ts <= 0) return;
  const std::int64_t now_ns = batch_wall_ns_;
  // Compared in milliseconds first so a far-future timestamp cannot
  // overflow the conversion to nanoseconds.
  const std::int64_t age_ns = ts > now_ns / 1'000'000 ? 0 : now_ns - ts * 1'000'000;
  emit_ages_.observe(static_cast<std::uint64_t>(age_ns));
}

// ------------------------------------------------------------ WorkerPool --

Status WorkerPool::build(const WorkerContext& context, std::uint32_t threads,
                         const std::string& extractor) {
  threads = std::max<std::uint32_t>(1, threads);
  for (std::uint32_t i = 0; i < threads; ++i) {
    auto made = identity::IdentityExtractor::create(extractor);
    if (!made) return fail("identity.extractor: " + made.error().message);
    workers_.push_back(std::make_unique<Worker>(i, context, std::move(*made)));
  }
  slices_per_worker_.assign(threads, 0);
  pending_.resize(threads);
  batch_size_ = std::max<std::size_t>(1, context.config.batch_size);
  return {};
}

void WorkerPool::start() {
  for (auto& w : workers_) w->start();
}

void WorkerPool::stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& w : workers_) {
    Work stop;
    stop.kind = Work::Kind::kStop;
    w->push(std::move(stop));
  }
  for (auto& w : workers_) w->join();
  for (auto& w : workers_) w->close_inbox();
}

void WorkerPool::open_inboxes(RdKafka::KafkaConsumer& consumer) {
  for (auto& w : workers_) w->open_inbox(consumer);
}

std::size_t WorkerPool::queued_records() const {
  std::size_t total = 0;
  for (const auto& w : workers_) total += w->queued_records();
  return total;
}

std::vector<std::uint64_t> WorkerPool::busy_nanos() const {
  std::vector<std::uint64_t> out;
  out.reserve(workers_.size());
  for (const auto& w : workers_) out.push_back(w->busy_nanos());
  return out;
}

void WorkerPool::push_batch(std::uint32_t worker) {
  Work w;
  w.records = std::move(pending_[worker]);
  pending_[worker].clear();
  pending_records_ -= w.records.size();
  workers_[worker]->push(std::move(w));
}

void WorkerPool::flush() {
  for (std::uint32_t i = 0; i < pending_.size(); ++i) {
    if (!pending_[i].empty()) push_batch(i);
  }
}

void WorkerPool::close(const std::map<std::uint32_t, std::vector<PartitionId>>& by_worker) {
  for (const auto& [w, list] : by_worker) workers_[w]->barrier(Work::Kind::kClose, list);
}

void WorkerPool::barrier_all(Work::Kind kind) {
  for (auto& w : workers_) w->barrier(kind);
}

std::uint32_t WorkerPool::adopt(std::unique_ptr<Slice> slice) {
  const std::uint32_t worker = choose_worker(slices_per_worker_);
  ++slices_per_worker_[worker];
  Work work;
  work.kind = Work::Kind::kAdopt;
  work.slice = std::move(slice);
  workers_[worker]->push(std::move(work));
  return worker;
}

void WorkerPool::release(const std::map<std::uint32_t, std::vector<PartitionId>>& by_worker,
                         Work::Kind kind, const std::vector<PartitionId>& capture) {
  for (const auto& [w, list] : by_worker) {
    workers_[w]->barrier(kind, list, capture);
    slices_per_worker_[w] -= static_cast<std::uint32_t>(list.size());
  }
}

}  // namespace kdedup::pipeline
