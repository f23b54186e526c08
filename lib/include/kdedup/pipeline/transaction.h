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

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"

namespace RdKafka {
class Producer;
class ConsumerGroupMetadata;
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

}  // namespace kdedup::pipeline
