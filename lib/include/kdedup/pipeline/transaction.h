#pragma once
// Exactly-once output (`delivery: transactional`): consume-transform-produce
// with Kafka transactions. Two layers:
//
// - TxnMachine: the pure state machine. It knows which transactional call is
//   allowed in which state and, given how a call ended (ok / retriable /
//   abortable / fatal, classified exactly as librdkafka documents for
//   rd_kafka_error_t in rdkafka.h and INTRODUCTION.md "Transactional API"),
//   what the caller must do next. No Kafka: unit-tested on its own.
// - TransactionalProducer: the thin librdkafka-backed producer that drives a
//   TxnMachine, retries retriable calls a bounded number of times and turns
//   every error into a TxnOutcome with a message a person can act on.
//
// How the pipeline must call it (one TransactionalProducer per kdedup
// process, i.e. per consumer-group member; transactional.id from
// transactional_id(group_id, instance_id) so a restarted member fences its
// own previous incarnation and no two members share an id):
//
//   init()                              once, before the consumer joins
//   loop on the consumer thread, one transaction per commit interval:
//     begin()
//     produce(...) / producer().produce(...) for every distinct record
//     send_offsets(next offsets of the batch, consumer.groupMetadata())
//     commit()
//       kProceed -> the offsets are committed with the output: NOW (not
//                   before) capture snapshots at those offsets and record
//                   them in the SnapshotGate (recovery.h); keep each
//                   partition's captured state as its "last committed state".
//       kRewind  -> the transaction was aborted: for every partition in it,
//                   restore the filter from its last committed state
//                   (restore_filter on the kept capture, or rebuild per
//                   RecoveryPlan when there is none), seek the consumer to
//                   the committed offsets (consumer.committed()), then
//                   begin() again. Nothing of the aborted transaction is
//                   visible to read_committed readers.
//       kStop    -> fatal (fenced by a newer instance with the same
//                   transactional.id, or a broken producer): stop consuming,
//                   do not commit anything, exit non-zero with message.
//   Revocation: commit() the open transaction before giving partitions up
//   (an abort instead is fine too: the new owner reads committed offsets).
//
// Threading: a TransactionalProducer is owned by the consumer thread; all
// transactional calls (init, begin, send_offsets, commit, abort) must come
// from that one thread and never overlap (librdkafka forbids concurrent
// transactional calls). produce() may be called from worker threads while a
// transaction is open (librdkafka's produce is thread-safe), but all produce
// calls of a transaction must return before send_offsets()/commit() start.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"

namespace RdKafka {
class Producer;
class KafkaConsumer;
class ConsumerGroupMetadata;
class DeliveryReportCb;
class EventCb;
}  // namespace RdKafka

namespace kdedup::pipeline {

/// Where the transactional producer is in its life.
enum class TxnState : std::uint8_t {
  kUninitialized,  ///< created; init() not yet successful
  kReady,          ///< initialized, no transaction open
  kInTransaction,  ///< begin() succeeded; produce / send_offsets / commit / abort allowed
  kAbortRequired,  ///< a call failed with an abortable error: only abort() is allowed
  kFatal,          ///< unrecoverable (fenced, fatal producer error): nothing is allowed
};

/// A transactional call.
enum class TxnOp : std::uint8_t { kInit, kBegin, kProduce, kSendOffsets, kCommit, kAbort };

/// How a call ended, from the rd_kafka_error_t flags (see classify()).
enum class TxnErrorClass : std::uint8_t {
  kNone,       ///< success
  kRetriable,  ///< is_retriable(): the same call may be repeated
  kAbortable,  ///< txn_requires_abort(): abort the transaction, then start over
  kFatal,      ///< is_fatal(), fenced, or an error of no documented class
};

/// What the caller must do next.
enum class TxnAction : std::uint8_t {
  kProceed,  ///< the call succeeded (or the abort finished without rewind need): go on
  kRetry,    ///< repeat the same call (TransactionalProducer does this itself)
  kAbort,    ///< call abort() now
  kRewind,   ///< the transaction is aborted: roll filters back to the last committed
             ///< state, seek to the committed offsets, then begin() again
  kStop,     ///< fatal: stop the service with the message
};

[[nodiscard]] const char* to_string(TxnState state) noexcept;
[[nodiscard]] const char* to_string(TxnOp op) noexcept;
[[nodiscard]] const char* to_string(TxnErrorClass c) noexcept;
[[nodiscard]] const char* to_string(TxnAction action) noexcept;

/// Classification of a transactional API error in librdkafka's documented
/// order of precedence: a fatal error is fatal whatever else it says; an
/// error that requires abort is abortable even if also marked retriable;
/// retriable next. Fenced codes (_FENCED, PRODUCER_FENCED,
/// INVALID_PRODUCER_EPOCH) are fatal. Anything without a class (e.g. _STATE,
/// invalid argument) is a usage error: fatal as well, never guessed around.
[[nodiscard]] TxnErrorClass classify(bool is_fatal, bool txn_requires_abort, bool is_retriable,
                                     bool fenced) noexcept;

/// The pure transactional state machine. Owned by whoever drives the
/// transactions (TransactionalProducer, or a test); single-threaded.
class TxnMachine {
 public:
  /// `max_retries`: how many times in a row a retriable result of the same
  /// call is answered with kRetry before it is escalated (kAbort inside a
  /// transaction, kStop for init/abort): a coordinator that never answers
  /// must not hang the service.
  explicit TxnMachine(std::uint32_t max_retries = 5) : max_retries_(max_retries) {}

  [[nodiscard]] TxnState state() const noexcept { return state_; }

  /// Whether `op` may be called in the current state. Calling a disallowed
  /// op is a program error; TransactionalProducer refuses it with a message.
  [[nodiscard]] bool allowed(TxnOp op) const noexcept;

  /// Feeds the result of `op` (which must be allowed()) and returns the next
  /// action; moves to the new state. Rules:
  ///  init:    ok -> Ready; retriable -> Retry; otherwise -> Fatal/Stop.
  ///  begin:   ok -> InTransaction; any error -> Fatal/Stop (librdkafka only
  ///           fails begin for fatal or state errors).
  ///  produce, send_offsets, commit:
  ///           ok -> Proceed (commit -> Ready); retriable -> Retry;
  ///           abortable -> AbortRequired/Abort; fatal -> Fatal/Stop.
  ///  abort:   ok -> Ready/Rewind; retriable -> Retry; otherwise -> Fatal/Stop.
  /// Retriable past max_retries escalates as described at the constructor.
  TxnAction on_result(TxnOp op, TxnErrorClass result) noexcept;

  /// Retriable results of the current call so far.
  [[nodiscard]] std::uint32_t retries() const noexcept { return retries_; }

 private:
  TxnAction escalate(TxnOp op) noexcept;

  TxnState state_ = TxnState::kUninitialized;
  std::uint32_t max_retries_;
  std::uint32_t retries_ = 0;
  std::optional<TxnOp> retrying_;
};

/// What one TransactionalProducer call did.
struct TxnOutcome {
  TxnAction action = TxnAction::kProceed;
  TxnErrorClass error = TxnErrorClass::kNone;  ///< class of the last error seen
  TxnState state = TxnState::kReady;           ///< state after the call
  std::uint32_t retries = 0;                   ///< retriable failures retried inside the call
  std::string message;  ///< empty on a clean success; else a complete sentence
  [[nodiscard]] bool ok() const noexcept { return action == TxnAction::kProceed; }
};

/// transactional.id for one member: "<group_id>-<instance_id>". The instance
/// id must be stable across restarts of the same member (the pod name of the
/// StatefulSet, group.instance.id) so the restarted member fences its
/// predecessor. Errors name what is missing or too long.
[[nodiscard]] Result<std::string> transactional_id(std::string_view group_id,
                                                   std::string_view instance_id);

/// One input position to commit with the transaction.
struct TxnOffset {
  std::string topic;
  std::int32_t partition = 0;
  std::int64_t offset = 0;  ///< Kafka convention: the next record to read
};

/// The librdkafka transactional producer. See the file comment for the call
/// order and threads.
class TransactionalProducer {
 public:
  struct Options {
    /// Producer properties (bootstrap.servers etc., config::producer_properties).
    /// transactional.id is set from `transactional_id`; enable.idempotence is
    /// implied by librdkafka.
    std::map<std::string, std::string> properties;
    std::string transactional_id;
    /// Per-call timeout given to librdkafka's transactional calls.
    std::chrono::milliseconds call_timeout{30'000};
    /// Retriable failures retried inside one call before escalation.
    std::uint32_t max_retries = 5;
    /// Pause between retries of a call.
    std::chrono::milliseconds retry_backoff{200};
    /// Optional callbacks for the pipeline's own produce path (delivery
    /// reports, client events); they must outlive the producer.
    RdKafka::DeliveryReportCb* delivery_reports = nullptr;
    RdKafka::EventCb* events = nullptr;
  };

  /// Builds the producer (no network yet). Fails naming an invalid property.
  [[nodiscard]] static Result<std::unique_ptr<TransactionalProducer>> create(Options options);
  ~TransactionalProducer();
  TransactionalProducer(const TransactionalProducer&) = delete;
  TransactionalProducer& operator=(const TransactionalProducer&) = delete;

  /// init_transactions(): registers the transactional.id with the
  /// coordinator, fencing any older producer with the same id and finishing
  /// (aborting) its open transaction.
  [[nodiscard]] TxnOutcome init();
  [[nodiscard]] TxnOutcome begin();
  /// Enqueues one record in the open transaction; the delivery result is
  /// folded into commit() by librdkafka (a failed delivery makes the
  /// transaction abortable). `partition` -1 = partitioner by key.
  [[nodiscard]] TxnOutcome produce(const std::string& topic, std::int32_t partition,
                                   std::optional<std::string_view> key, std::string_view value,
                                   std::int64_t timestamp_ms = 0);
  /// send_offsets_to_transaction() with the consumer's group metadata
  /// (KafkaConsumer::groupMetadata(), caller keeps ownership).
  [[nodiscard]] TxnOutcome send_offsets(const std::vector<TxnOffset>& offsets,
                                        const RdKafka::ConsumerGroupMetadata& group);
  /// commit_transaction(): flushes, then commits output and offsets at once.
  [[nodiscard]] TxnOutcome commit();
  /// abort_transaction(): drops the open transaction's output.
  [[nodiscard]] TxnOutcome abort();

  [[nodiscard]] TxnState state() const noexcept { return machine_.state(); }
  [[nodiscard]] const std::string& id() const noexcept { return options_.transactional_id; }

  /// The underlying producer, to produce with headers and delivery reports
  /// (the pipeline's own produce path). Only while kInTransaction.
  [[nodiscard]] RdKafka::Producer& producer() noexcept { return *producer_; }

 private:
  TransactionalProducer(Options options, std::unique_ptr<RdKafka::Producer> producer);
  template <class Call>
  TxnOutcome run(TxnOp op, Call&& call);

  Options options_;
  std::unique_ptr<RdKafka::Producer> producer_;
  TxnMachine machine_;
};

// ---------------------------------------------------------------------------
// The transaction loop of `delivery: transactional`.

/// The transactional calls a TxnLoop makes: TransactionalProducer through
/// ProducerTxnCalls in the pipeline, a scripted fake in unit tests.
class TxnCalls {
 public:
  virtual ~TxnCalls() = default;
  [[nodiscard]] virtual TxnOutcome begin() = 0;
  [[nodiscard]] virtual TxnOutcome send_offsets(const std::vector<TxnOffset>& offsets) = 0;
  [[nodiscard]] virtual TxnOutcome commit() = 0;
  [[nodiscard]] virtual TxnOutcome abort() = 0;
};

/// TxnCalls on a TransactionalProducer, with the group metadata of the
/// consumer whose positions are committed (asked anew for each
/// send_offsets: the generation changes with every rebalance). Both are
/// owned by the caller and outlive this object; consumer thread only.
class ProducerTxnCalls final : public TxnCalls {
 public:
  ProducerTxnCalls(TransactionalProducer& producer, RdKafka::KafkaConsumer& consumer)
      : producer_(producer), consumer_(consumer) {}
  [[nodiscard]] TxnOutcome begin() override { return producer_.begin(); }
  [[nodiscard]] TxnOutcome send_offsets(const std::vector<TxnOffset>& offsets) override;
  [[nodiscard]] TxnOutcome commit() override { return producer_.commit(); }
  [[nodiscard]] TxnOutcome abort() override { return producer_.abort(); }

 private:
  TransactionalProducer& producer_;
  RdKafka::KafkaConsumer& consumer_;
};

/// One partition to bring back to its last committed state after an abort.
struct TxnRollback {
  std::string topic;
  std::int32_t partition = 0;
  /// The offset this member committed last for it (the offset it sent in
  /// the last successful transaction); none = this member never committed
  /// it, so the position the partition started from at assignment applies.
  std::optional<std::int64_t> committed;
  /// Where the aborted transaction had got to (its uncommitted position).
  std::int64_t reached = 0;
};

/// What a TxnLoop needs from the pipeline; implemented on the consumer
/// thread, every call comes from TxnLoop on that thread.
class TxnHost {
 public:
  virtual ~TxnHost() = default;
  /// Hands out no new records and returns once the workers processed
  /// everything handed to them and every output produced in the open
  /// transaction was acknowledged; false when that did not happen in time.
  [[nodiscard]] virtual bool settle() = 0;
  /// The commit position (next offset to read) of every assigned partition
  /// that has processed a record.
  [[nodiscard]] virtual std::vector<TxnOffset> positions() = 0;
  /// Output-topic records produced into the open transaction so far.
  [[nodiscard]] virtual std::uint64_t open_outputs() = 0;
  /// Why the open transaction cannot commit (a produce or a delivery of it
  /// failed), if it cannot.
  [[nodiscard]] virtual std::optional<std::string> abort_reason() = 0;
  /// A new transaction is open: reset open_outputs() and abort_reason().
  virtual void began() = 0;
  /// The transaction committed: `offsets` are the group's committed
  /// positions now, together with the output (the point to feed the
  /// SnapshotGate and take snapshots at those offsets).
  virtual void committed(const std::vector<TxnOffset>& offsets) = 0;
  /// The transaction was aborted: drop these partitions' state (no
  /// snapshot), rebuild it as it was at their last committed offset and
  /// fetch from there. An error stops the service.
  [[nodiscard]] virtual Status roll_back(const std::vector<TxnRollback>& partitions) = 0;
};

/// Counters of a TxnLoop, readable from any thread.
struct TxnTotals {
  std::uint64_t committed = 0;          ///< transactions committed
  std::uint64_t aborted = 0;            ///< transactions aborted (each followed by a rollback)
  std::uint64_t records_committed = 0;  ///< output records of committed transactions
  std::uint64_t records_aborted = 0;    ///< output records of aborted transactions
  std::uint64_t partitions_rolled_back = 0;
};

/// Drives consume-transform-produce transactions for one member: one
/// transaction is always open between rounds; a round settles the
/// pipeline, sends the positions with the group metadata, commits, and
/// begins the next; an abortable failure aborts and rolls the partitions
/// of the transaction back to the positions this member committed last.
/// Remembers those positions (the only record of them on a broker that
/// does not store transactional offsets, and the rollback target anyway).
///
/// Owned by the pipeline; every call from the consumer thread except
/// totals(), which any thread may call.
class TxnLoop {
 public:
  TxnLoop(TxnCalls& calls, TxnHost& host) : calls_(calls), host_(host) {}

  /// Begins the first transaction (the producer's init() already succeeded).
  [[nodiscard]] Status start();

  enum class Ending : std::uint8_t {
    kCommitted,   ///< committed; a new transaction is open (unless finish())
    kIdle,        ///< nothing new since the last commit: the transaction stays open
    kRolledBack,  ///< aborted and rolled back; a new transaction is open
    kStopped,     ///< fatal: stop the service with `message`, commit nothing more
  };
  struct Round {
    Ending ending = Ending::kIdle;
    std::string message;             ///< why it aborted or stopped
    std::vector<TxnOffset> offsets;  ///< what was committed (kCommitted)
  };

  /// Commits the open transaction with every position the host reports and
  /// begins the next one. `leaving`: partitions given up right after this
  /// round (revocation); they are included in the commit, never rolled
  /// back, and forgotten afterwards.
  [[nodiscard]] Round commit(std::span<const TxnOffset> leaving = {});
  /// Aborts the open transaction (`why` is logged), rolls back every
  /// partition that moved in it except `leaving`, begins the next one.
  [[nodiscard]] Round abort(const std::string& why, std::span<const TxnOffset> leaving = {});
  /// Commits the open transaction and begins none (graceful shutdown).
  [[nodiscard]] Round finish();

  /// The partition is no longer ours: forget its committed position.
  void forget(const std::string& topic, std::int32_t partition);
  /// The position this member committed last for the partition.
  [[nodiscard]] std::optional<std::int64_t> committed(const std::string& topic,
                                                      std::int32_t partition) const;

  [[nodiscard]] TxnTotals totals() const noexcept;

 private:
  using Key = std::pair<std::string, std::int32_t>;
  Round end(bool begin_next, std::span<const TxnOffset> leaving);
  Round abort_and_roll_back(const std::string& why, std::span<const TxnOffset> leaving,
                            bool begin_next);
  Round stopped(std::string message);
  [[nodiscard]] bool begin_next(Round& round);
  void forget_all(std::span<const TxnOffset> leaving);

  TxnCalls& calls_;
  TxnHost& host_;
  std::map<Key, std::int64_t> committed_;  // consumer thread only
  bool open_ = false;                      // a transaction is open
  bool stopped_ = false;                   // a fatal outcome ended the loop
  std::string stop_message_;
  std::atomic<std::uint64_t> commits_{0}, aborts_{0}, records_committed_{0}, records_aborted_{0},
      rolled_back_{0};
};

}  // namespace kdedup::pipeline
