// The consumer loop and shutdown of `kdedup run`, and how the parts are put
// together (lib/src/pipeline/README.md has the map). See pipeline.h for the
// thread model; the invariants kept across the parts:
// - a partition's records are processed by exactly one worker, in offset
//   order, and its Slice is touched only by that worker (worker.h);
// - an offset is registered with its OffsetTracker before any of its outputs
//   is produced, so no delivery report can overtake the registration
//   (PartitionProcessor);
// - a revoked partition is closed first (its worker processes no record of
//   it after what it was handed), then released once what was processed
//   was delivered and the position committed (rebalance.h,
//   CommitProtocol::hand_over);
// - a partition's queue forwards to a worker's inbox only once that worker
//   holds its Slice (Rebalance::assign), and no longer once the partition
//   is revoked or the pipeline shuts down;
// - a recovering partition's records before its ReplayRule's end are
//   decided but never produced, and the position handed to the committer
//   never goes below the committed offset it started from
//   (partition_recovery.h);
// - a snapshot capture is written only once a commit covers it
//   (Snapshotter, CommitContext::on_committed), so no snapshot is ahead of
//   the committed offset.

#include "kdedup/pipeline/pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <thread>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include "assigned_partitions.h"
#include "commit_protocol.h"
#include "fatal_error.h"
#include "kafka_clients.h"
#include "kafka_errors.h"
#include "kdedup/pipeline/confirm.h"
#include "kdedup/pipeline/snapshotter.h"
#include "kdedup/state/snapshot_store.h"
#include "partition_recovery.h"
#include "rebalance.h"
#include "worker.h"

namespace kdedup::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

PartitionStats partition_stats(const PartitionId& id, const Assigned& a) {
  const auto& c = *a.counters;
  PartitionStats p;
  p.topic = id.topic;
  p.partition = id.partition;
  p.worker = a.worker;
  p.records_in = c.records_in.load(std::memory_order_relaxed);
  p.distinct = c.distinct.load(std::memory_order_relaxed);
  p.duplicates = c.duplicates.load(std::memory_order_relaxed);
  p.invalid = c.invalid.load(std::memory_order_relaxed);
  p.dead_lettered = c.dead_lettered.load(std::memory_order_relaxed);
  p.invalid_dropped = c.invalid_dropped.load(std::memory_order_relaxed);
  p.invalid_passed = c.invalid_passed.load(std::memory_order_relaxed);
  p.produced = c.produced.load(std::memory_order_relaxed);
  p.delivery_errors = c.delivery_errors.load(std::memory_order_relaxed);
  p.clock_capped = c.clock_capped.load(std::memory_order_relaxed);
  p.no_timestamp = c.no_timestamp.load(std::memory_order_relaxed);
  p.clock_ms = c.clock_ms.load(std::memory_order_relaxed);
  p.next_offset = c.next_offset.load(std::memory_order_relaxed);
  p.committed_offset = a.committed;
  p.in_flight = a.tracker->in_flight();
  p.batch_times = c.batch_times.read();
  p.emit_ages = c.emit_ages.read();
  p.queued = static_cast<std::uint64_t>(
      std::max<std::int64_t>(0, c.queued.load(std::memory_order_relaxed)));
  p.replayed = c.replayed.load(std::memory_order_relaxed);
  p.restoring = c.restoring.load(std::memory_order_relaxed);
  p.invalid_reasons = c.invalid_reasons();
  p.filter_bytes = c.filter_bytes.load(std::memory_order_relaxed);
  p.filter_subfilters = c.filter_subfilters.load(std::memory_order_relaxed);
  p.filter_fpp_estimate = c.filter_fpp_estimate.load(std::memory_order_relaxed);
  p.parked = c.parked.load(std::memory_order_relaxed);
  p.unparks = c.unparks.load(std::memory_order_relaxed);
  p.snapshot_current = c.snapshot_current.load(std::memory_order_relaxed);
  p.confirm = c.confirm.read();
  return p;
}

}  // namespace

/// The parts of one Pipeline and its consumer loop. Built by create() on
/// the caller's thread; run() is the consumer thread; stats() any thread.
/// Members are destroyed in reverse order: the consumer before the
/// callbacks it calls (rebalance, protocol, events), the protocol (and its
/// producer) after the workers released their topic handles.
struct Pipeline::Impl {
  Impl(const config::Config& c, SliceHooks h, state::SnapshotStore* s)
      : config(c), hooks(std::move(h)), options(slice_options(c)), store(s) {}
  ~Impl() {
    // Leave the group before the workers go away (close() may call back).
    if (consumer && !closed) consumer->close();
    if (subscribed && !rebalance->joined_once()) {
      abandon_unsynced_consumer(std::move(consumer), std::move(consumer_events));
    }
    stop_threads();
    // Writes still queued call back into the Snapshotter: finish them first.
    if (store != nullptr) store->drain();
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  [[nodiscard]] Status build();
  [[nodiscard]] Status run(const std::atomic<bool>& stop);
  [[nodiscard]] PipelineStats stats() const;

  config::Config config;
  SliceHooks hooks;
  SliceOptions options;
  state::SnapshotStore* store = nullptr;  // null: no snapshots
  FatalError fatal;
  AssignedPartitions partitions;  // consumer thread (stats() under its lock)
  WorkerPool workers;
  RecoverySetup recovery{config, options, hooks, partitions, workers, store};
  std::optional<WorkerContext> worker_context;
  std::unique_ptr<Snapshotter> snapshotter;  // set when store is (and the filter on)
  std::unique_ptr<CommitProtocol> protocol;
  std::unique_ptr<Rebalance> rebalance;
  // On the heap: a consumer stopped before its first group join keeps it
  // (abandon_unsynced_consumer).
  std::unique_ptr<ClientEvents> consumer_events =
      std::make_unique<ClientEvents>([this](std::string reason) { fatal.set(std::move(reason)); },
                                     "consumer", hooks.on_statistics);
  bool subscribed = false;
  std::unique_ptr<RdKafka::KafkaConsumer> consumer;
  std::chrono::milliseconds first_join_wait{50'000};

  std::thread delivery_thread;
  std::atomic<bool> delivery_stop{false};
  // Consumer-loop heartbeat: steady-clock nanoseconds of the loop's last
  // turn, -1 before run() starts it (see PipelineStats::consumer_loop_age_ms).
  std::atomic<std::int64_t> loop_beat_ns{-1};
  bool ran = false;
  bool closed = false;
  bool threads_stopped = false;

 private:
  [[nodiscard]] Status build_workers();
  void on_snapshot_written(const PartitionId& id, const Result<state::WriteReport>& result);
  [[nodiscard]] Status start();
  void consume(const std::atomic<bool>& stop);
  void on_fetched(std::span<rd_kafka_message_t* const> fetched, Clock::time_point now);
  [[nodiscard]] Status shut_down();
  void wait_for_commits(Clock::time_point deadline);
  void leave_group(Clock::time_point deadline);
  void finish_snapshots(Clock::time_point deadline);
  void drain_until(Clock::time_point deadline, const std::function<bool()>& done);
  void stop_threads();
  void beat_loop(Clock::time_point now) noexcept {
    loop_beat_ns.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
        std::memory_order_relaxed);
  }
};

SliceOptions slice_options(const config::Config& config) {
  SliceOptions o;
  o.window_ms = config.window_ms();
  o.max_future_skew_ms = config.max_future_skew.count();
  o.filter_enabled = config.filter_enabled;
  o.refresh = config.on_duplicate == config::OnDuplicate::kRefresh;
  o.filter = config.filter;
  o.memory = make_memory_budget(config);
  return o;
}

// ------------------------------------------------------------- building --

Status Pipeline::Impl::build() {
  // Confirmed mode: every Slice (built by Recovery from `options`) attaches
  // to its partition in the SnapshotStore's confirm store.
  auto confirm = confirm_store_for(config, store);
  if (!confirm) return tl::unexpected(confirm.error());
  options.confirm = *confirm;
  if (store != nullptr && config.filter_enabled) {
    snapshotter = std::make_unique<Snapshotter>(
        [s = store](state::SnapshotCapture c, Snapshotter::Done done) {
          s->submit(std::move(c), std::move(done));
        },
        [this](const PartitionId& id, const Result<state::WriteReport>& r) {
          on_snapshot_written(id, r);
        });
  }
  recovery.snapshotter = snapshotter.get();
  protocol = make_commit_protocol(
      CommitContext{config, fatal, partitions, workers, recovery, snapshotter.get()});
  recovery.reconcile = protocol->output_ahead_of_commits();
  rebalance = std::make_unique<Rebalance>(recovery, *protocol, fatal, partitions, workers);

  const bool statistics = static_cast<bool>(hooks.on_statistics);
  if (auto s = protocol->build_producer(producer_properties_for(config, statistics),
                                        hooks.on_statistics);
      !s) {
    return s;
  }
  config::KafkaProperties extra;
  RdKafka::OffsetCommitCb* commits = protocol->configure_consumer(extra);
  auto built =
      build_consumer(config, statistics, extra, {rebalance.get(), commits, consumer_events.get()});
  if (!built) return tl::unexpected(built.error());
  consumer = std::move(built->consumer);
  first_join_wait = built->first_join_wait;
  protocol->attach(*consumer);
  recovery.consumer = consumer.get();
  return build_workers();
}

Status Pipeline::Impl::build_workers() {
  std::uint64_t salt_check = 0;
  if (store != nullptr && config.filter_enabled) {
    // Slow on purpose (Argon2id): once per process, not per snapshot.
    const auto t0 = Clock::now();
    auto check = filter::salt_check(config.identity.salt);
    if (!check) return fail("state.dir: " + check.error().message);
    salt_check = *check;
    spdlog::debug("salt check value for snapshots derived in {} ms",
                  std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
  }
  worker_context.emplace(WorkerContext{
      config, protocol->producer(), *protocol, fatal, filter::Fingerprinter(config.identity.salt),
      hooks, snapshotter.get(), salt_check, options.memory, snapshotter ? store : nullptr,
      state::state_fingerprint(config.filter, config.tick_scale(), salt_check)});
  recovery.salt_check = salt_check;
  recovery.fingerprinter = &worker_context->fingerprinter;
  if (auto s = workers.build(*worker_context, config.threads, config.identity.extractor); !s) {
    return s;
  }
  if (config.delivery != config::Delivery::kTransactional) workers.open_inboxes(*consumer);
  // The consumer thread's extractor: recovery learns identities from output
  // records whose input was deleted by retention.
  if (auto e = identity::IdentityExtractor::create(config.identity.extractor)) {
    recovery.extractor = std::move(*e);
  }
  return {};
}

void Pipeline::Impl::on_snapshot_written(const PartitionId& id,
                                         const Result<state::WriteReport>& result) {
  if (!result) {
    fatal.set(fmt::format(
        "cannot write the snapshot of {} to state.dir '{}': {}. Stopping cleanly: delivered "
        "records are committed; the next start restores the last good snapshots or rebuilds "
        "from Kafka",
        id.str(), store->dir(), result.error().message));
  } else {
    spdlog::debug("snapshot of {} written: {} bytes ({} of {} chunks) in {:.1f} ms", id.str(),
                  result->bytes_written, result->chunks_written, result->chunks_total,
                  static_cast<double>(result->write_time.count()) / 1e6);
  }
  if (hooks.on_snapshot) hooks.on_snapshot(id, result);
}

// -------------------------------------------------------- consumer loop --

Status Pipeline::Impl::run(const std::atomic<bool>& stop) {
  if (ran) return fail("a Pipeline runs only once");
  ran = true;
  if (auto s = start(); !s) return s;
  consume(stop);
  return shut_down();
}

/// Starts the threads and joins the group.
Status Pipeline::Impl::start() {
  workers.start();
  delivery_thread = std::thread([this] {
    RdKafka::Producer& p = protocol->producer();
    while (!delivery_stop.load(std::memory_order_relaxed)) p.poll(50);
  });
  // Before the consumer joins: a transactional producer fences a previous
  // incarnation of this member and finishes its open transaction.
  if (auto s = protocol->start(); !s) {
    stop_threads();
    return s;
  }
  if (RdKafka::ErrorCode err = consumer->subscribe(config.input.topics);
      err != RdKafka::ERR_NO_ERROR) {
    stop_threads();
    return fail("cannot subscribe to the input topics: " + describe_kafka_error(err));
  }
  subscribed = true;
  spdlog::info("joined consumer group '{}' as {}", config.group_id, consumer->name());
  return {};
}

namespace {

struct QueueFree {
  void operator()(rd_kafka_queue_t* q) const noexcept { rd_kafka_queue_destroy(q); }
};

}  // namespace

/// Polls and hands records to the workers until `stop` or a fatal error;
/// rebalance and commit callbacks run inside the consume calls.
void Pipeline::Impl::consume(const std::atomic<bool>& stop) {
  // Bound the records between the consumer and the workers so memory stays
  // flat when the output is slower than the input.
  const std::size_t max_queued =
      static_cast<std::size_t>(config.batch_size) * workers.size() * 8 + 1024;
  constexpr auto kMaxLinger = std::chrono::milliseconds(5);
  constexpr auto kCheckRestoredEvery = std::chrono::milliseconds(50);
  constexpr int kWaitMs = 20;
  // Records are taken in batches through librdkafka's C API: whatever the
  // consumer queue holds at once, else a wait for the next one. A record
  // costs no wrapper object, no clock reads and no call of its own.
  const std::unique_ptr<rd_kafka_queue_t, QueueFree> queue(
      rd_kafka_queue_get_consumer(consumer->c_ptr()));
  if (!queue) {
    fatal.set("internal error: the consumer has no group queue");
    return;
  }
  std::vector<rd_kafka_message_t*> fetched(std::min<std::size_t>(max_queued, 4096));
  auto next_check = Clock::now() + kCheckRestoredEvery;
  while (!stop.load(std::memory_order_relaxed) && !fatal.raised()) {
    // One clock read a turn (a turn is one batch under load): what waits
    // on it (the linger, the loop turn's periodic work) is in milliseconds,
    // and a turn that waited for a record flushed anyway.
    const auto now = Clock::now();
    beat_loop(now);
    if (const std::size_t queued = workers.queued_records(); queued > max_queued) {
      workers.flush();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      const std::size_t room = std::min(fetched.size(), max_queued - queued + 1);
      ssize_t n = rd_kafka_consume_batch_queue(queue.get(), 0, fetched.data(), room);
      if (n == 0) n = rd_kafka_consume_batch_queue(queue.get(), kWaitMs, fetched.data(), 1);
      if (n < 0) {
        fatal.set("consumer: " +
                  describe_kafka_error(static_cast<RdKafka::ErrorCode>(rd_kafka_last_error())));
        break;
      }
      if (n == 0) workers.flush();
      on_fetched(std::span(fetched.data(), static_cast<std::size_t>(n)), now);
      workers.flush_lingering(now, kMaxLinger);
    }
    protocol->on_loop_turn(now);
    if (now >= next_check) {
      check_restored(partitions, *consumer, hooks);
      next_check = Clock::now() + kCheckRestoredEvery;
    }
  }
}

/// Takes ownership of `fetched` and hands each record to the worker of its
/// partition. The consumer returns a partition's records in runs: one
/// lookup and one counter update a run.
void Pipeline::Impl::on_fetched(std::span<rd_kafka_message_t* const> fetched,
                                Clock::time_point now) {
  std::size_t i = 0;
  while (i < fetched.size()) {
    MessagePtr head(fetched[i]);
    if (head->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      const char* topic = head->rkt != nullptr ? rd_kafka_topic_name(head->rkt) : "";
      if (classify_consumed(static_cast<RdKafka::ErrorCode>(head->err), topic, *consumer, fatal,
                            "consumer") == Consumed::kIdle) {
        workers.flush();
      }
      ++i;
      continue;
    }
    std::size_t end = i + 1;
    while (end < fetched.size() && fetched[end]->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
           fetched[end]->rkt == head->rkt && fetched[end]->partition == head->partition) {
      ++end;
    }
    Assigned* a = partitions.find(PartitionId{rd_kafka_topic_name(head->rkt), head->partition});
    if (a == nullptr) {
      // Not ours (any more): not committed, re-read by the owner.
      for (std::size_t j = i + 1; j < end; ++j) rd_kafka_message_destroy(fetched[j]);
      i = end;
      continue;
    }
    if (a->start_offset < 0) a->start_offset = head->offset;
    a->counters->queued.fetch_add(static_cast<std::int64_t>(end - i), std::memory_order_relaxed);
    workers.dispatch(std::move(head), a->worker, now);
    for (std::size_t j = i + 1; j < end; ++j)
      workers.dispatch(MessagePtr(fetched[j]), a->worker, now);
    i = end;
  }
}

// ------------------------------------------------------------- shutdown --

/// Stop fetching, finish in-flight records, commit, leave, write the final
/// snapshots.
Status Pipeline::Impl::shut_down() {
  const bool graceful = !fatal.raised();
  spdlog::info(graceful ? "shutting down: finishing in-flight records"
                        : "stopping after a fatal error; committing what was delivered");
  // The workers finish what they were handed and take no more records.
  const auto ids = partitions.ids();
  stop_forwarding(*consumer, workers, ids);
  workers.flush();
  workers.close(partitions.by_worker(ids));
  workers.barrier_all();
  const auto deadline =
      Clock::now() + (graceful ? config.shutdown_timeout : std::chrono::milliseconds(5'000));
  partitions.wait_delivered(partitions.ids(), deadline);
  protocol->finish();
  wait_for_commits(deadline);
  // Final snapshots at the committed positions (a capture ahead of a
  // confirmed commit waits and is never written).
  if (snapshotter && graceful) workers.barrier_all(Work::Kind::kCapture);
  leave_group(deadline);
  stop_threads();
  finish_snapshots(deadline);
  protocol->log_totals();
  if (fatal.raised()) return fail(fatal.message());
  spdlog::info("stopped cleanly");
  return {};
}

/// Waits (serving callbacks) until the committer confirmed every stored
/// position: it commits only while the group is stable, so this also waits
/// out a rebalance in progress instead of committing into it. close() would
/// commit them too, but a commit sent while a rejoin is pending is refused
/// (idempotent_commits.cc) and the next owner would read them again.
void Pipeline::Impl::wait_for_commits(Clock::time_point deadline) {
  drain_until(deadline, [this] { return partitions.all_stored_confirmed(); });
  if (!partitions.all_stored_confirmed()) {
    spdlog::warn(
        "not every final offset was confirmed within shutdown_timeout; close() tries once "
        "more, else the next owner reads those records again");
  }
}

void Pipeline::Impl::leave_group(Clock::time_point deadline) {
  // librdkafka 2.0.2 asserts in rd_kafka_sticky_assignor_state_destroy() when
  // a cooperative-sticky member is closed before its first SyncGroup
  // completed (the assignor state is still NULL; fixed in librdkafka 2.3.0,
  // confluentinc/librdkafka#4312). Such a member holds nothing, so waiting
  // for that first round (assigned 0 partitions or more) costs no progress.
  if (!rebalance->joined_once()) {
    spdlog::info("waiting for the group join to complete before leaving");
    drain_until(Clock::now() + first_join_wait, [this] { return rebalance->joined_once(); });
  }
  // close() revokes everything through the rebalance callback (which finds
  // nothing left to do but hand the partitions back) and leaves the group.
  closed = true;
  if (RdKafka::ErrorCode err = consumer->close(); err != RdKafka::ERR_NO_ERROR) {
    spdlog::warn("leaving the consumer group: {}", describe_kafka_error(err));
  }
  const auto remaining = std::max<std::int64_t>(
      100, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  protocol->producer().flush(static_cast<int>(std::min<std::int64_t>(remaining, INT32_MAX)));
}

void Pipeline::Impl::finish_snapshots(Clock::time_point deadline) {
  if (!snapshotter) return;
  const auto left = std::max<std::int64_t>(
      1'000,
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  if (!snapshotter->wait_idle(std::chrono::milliseconds(left))) {
    spdlog::warn("snapshot writes still running after shutdown_timeout; waiting for them");
  }
  store->drain();
  const auto c = snapshotter->counts();
  spdlog::info(
      "snapshots: {} written, {} failed, {} superseded, {} not covered by a commit (not "
      "written)",
      c.written, c.failed, c.replaced, c.waiting + c.dropped);
}

void Pipeline::Impl::drain_until(Clock::time_point deadline, const std::function<bool()>& done) {
  // Serves callbacks (rebalance, commit results) without processing records:
  // a record fetched now is neither processed nor stored, so whoever owns its
  // partition next reads it again.
  for (auto now = Clock::now(); !done() && now < deadline; now = Clock::now()) {
    beat_loop(now);
    const std::unique_ptr<RdKafka::Message> msg(consumer->consume(50));
  }
}

void Pipeline::Impl::stop_threads() {
  if (threads_stopped) return;
  threads_stopped = true;
  workers.stop();
  delivery_stop.store(true);
  if (delivery_thread.joinable()) delivery_thread.join();
}

PipelineStats Pipeline::Impl::stats() const {
  PipelineStats s;
  s.rebalances = rebalance->count();
  const TxnTotals t = protocol->totals();
  s.transactions.committed = t.committed;
  s.transactions.aborted = t.aborted;
  s.transactions.records_committed = t.records_committed;
  s.transactions.records_aborted = t.records_aborted;
  s.transactions.partitions_rolled_back = t.partitions_rolled_back;
  s.ready = rebalance->ready();
  if (const std::int64_t beat = loop_beat_ns.load(std::memory_order_relaxed); beat >= 0) {
    s.consumer_loop_age_ms = std::max<std::int64_t>(0, (steady_ns() - beat) / 1'000'000);
  }
  if (const auto& m = options.memory) {
    s.memory.max_bytes = m->max_bytes();
    s.memory.used_bytes = m->used();
    s.memory.effective_fpp = m->effective_fpp();
  }
  const auto lock = partitions.lock();
  s.assigned_partitions = partitions.size();
  s.worker_busy_nanos = workers.busy_nanos();
  for (const auto& [id, a] : partitions.all()) s.partitions.push_back(partition_stats(id, a));
  return s;
}

// --------------------------------------------------------------- facade --

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() = default;

Result<std::unique_ptr<Pipeline>> Pipeline::create(const config::Config& config, SliceHooks hooks,
                                                   state::SnapshotStore* store) {
  auto impl = std::make_unique<Impl>(config, std::move(hooks), store);
  if (auto s = impl->build(); !s) return tl::unexpected(s.error());
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

Status Pipeline::check_topics() {
  return pipeline::check_topics(*impl_->consumer, impl_->config, impl_->recovery.output_partitions);
}

Status Pipeline::run(const std::atomic<bool>& stop) { return impl_->run(stop); }

PipelineStats Pipeline::stats() const { return impl_->stats(); }

}  // namespace kdedup::pipeline
