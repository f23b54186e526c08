#include "kdedup/pipeline/transaction.h"

#include "kdedup/common/partitions.h"

#include <algorithm>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <librdkafka/rdkafkacpp.h>
#include <spdlog/spdlog.h>

#include "kafka_errors.h"
#include "kdedup/config/config.h"

namespace kdedup::pipeline {

const char* to_string(TxnState state) noexcept {
  switch (state) {
    case TxnState::kUninitialized:
      return "uninitialized";
    case TxnState::kReady:
      return "ready";
    case TxnState::kInTransaction:
      return "in_transaction";
    case TxnState::kAbortRequired:
      return "abort_required";
    case TxnState::kFatal:
      return "fatal";
  }
  return "unknown";
}

const char* to_string(TxnOp op) noexcept {
  switch (op) {
    case TxnOp::kInit:
      return "init_transactions";
    case TxnOp::kBegin:
      return "begin_transaction";
    case TxnOp::kProduce:
      return "produce";
    case TxnOp::kSendOffsets:
      return "send_offsets_to_transaction";
    case TxnOp::kCommit:
      return "commit_transaction";
    case TxnOp::kAbort:
      return "abort_transaction";
  }
  return "unknown";
}

const char* to_string(TxnErrorClass c) noexcept {
  switch (c) {
    case TxnErrorClass::kNone:
      return "none";
    case TxnErrorClass::kRetriable:
      return "retriable";
    case TxnErrorClass::kAbortable:
      return "abortable";
    case TxnErrorClass::kFatal:
      return "fatal";
  }
  return "unknown";
}

const char* to_string(TxnAction action) noexcept {
  switch (action) {
    case TxnAction::kProceed:
      return "proceed";
    case TxnAction::kRetry:
      return "retry";
    case TxnAction::kAbort:
      return "abort";
    case TxnAction::kRewind:
      return "rewind";
    case TxnAction::kStop:
      return "stop";
  }
  return "unknown";
}

TxnErrorClass classify(bool is_fatal, bool txn_requires_abort, bool is_retriable,
                       bool fenced) noexcept {
  if (is_fatal || fenced) return TxnErrorClass::kFatal;
  if (txn_requires_abort) return TxnErrorClass::kAbortable;
  if (is_retriable) return TxnErrorClass::kRetriable;
  return TxnErrorClass::kFatal;
}

bool TxnMachine::allowed(TxnOp op) const noexcept {
  switch (state_) {
    case TxnState::kUninitialized:
      return op == TxnOp::kInit;
    case TxnState::kReady:
      return op == TxnOp::kBegin;
    case TxnState::kInTransaction:
      return op == TxnOp::kProduce || op == TxnOp::kSendOffsets || op == TxnOp::kCommit ||
             op == TxnOp::kAbort;
    case TxnState::kAbortRequired:
      return op == TxnOp::kAbort;
    case TxnState::kFatal:
      return false;
  }
  return false;
}

TxnAction TxnMachine::escalate(TxnOp op) noexcept {
  // Inside a transaction an exhausted retry gives up on the transaction,
  // which is always safe (rewind and redo); an init or abort that cannot
  // finish leaves no safe way forward.
  retries_ = 0;
  retrying_.reset();
  if (op == TxnOp::kProduce || op == TxnOp::kSendOffsets || op == TxnOp::kCommit) {
    state_ = TxnState::kAbortRequired;
    return TxnAction::kAbort;
  }
  state_ = TxnState::kFatal;
  return TxnAction::kStop;
}

TxnAction TxnMachine::on_result(TxnOp op, TxnErrorClass result) noexcept {
  if (!allowed(op)) {
    state_ = TxnState::kFatal;
    return TxnAction::kStop;
  }
  if (result == TxnErrorClass::kRetriable && op != TxnOp::kBegin) {
    if (retrying_ != op) {
      retrying_ = op;
      retries_ = 0;
    }
    if (++retries_ > max_retries_) return escalate(op);
    return TxnAction::kRetry;
  }
  retries_ = 0;
  retrying_.reset();
  if (result == TxnErrorClass::kFatal) {
    state_ = TxnState::kFatal;
    return TxnAction::kStop;
  }
  switch (op) {
    case TxnOp::kInit:
      if (result == TxnErrorClass::kNone) {
        state_ = TxnState::kReady;
        return TxnAction::kProceed;
      }
      break;  // abortable during init: there is no transaction to abort
    case TxnOp::kBegin:
      if (result == TxnErrorClass::kNone) {
        state_ = TxnState::kInTransaction;
        return TxnAction::kProceed;
      }
      break;
    case TxnOp::kProduce:
    case TxnOp::kSendOffsets:
    case TxnOp::kCommit:
      if (result == TxnErrorClass::kNone) {
        if (op == TxnOp::kCommit) state_ = TxnState::kReady;
        return TxnAction::kProceed;
      }
      state_ = TxnState::kAbortRequired;
      return TxnAction::kAbort;
    case TxnOp::kAbort:
      if (result == TxnErrorClass::kNone) {
        state_ = TxnState::kReady;
        return TxnAction::kRewind;
      }
      break;  // abort_transaction itself cannot be "abortable"
  }
  state_ = TxnState::kFatal;
  return TxnAction::kStop;
}

Result<std::string> transactional_id(std::string_view group_id, std::string_view instance_id) {
  if (group_id.empty()) return fail("transactional.id: the consumer group id is empty");
  if (instance_id.empty()) {
    return fail(
        "transactional.id: the instance id is empty; delivery: transactional needs a stable "
        "instance id per member (kafka.group.instance.id, e.g. the pod name)");
  }
  std::string id = fmt::format("{}-{}", group_id, instance_id);
  // The coordinator keeps ids as Kafka strings (int16 length).
  if (id.size() > 32767) return fail("transactional.id: group id + instance id exceed 32767 bytes");
  return id;
}

namespace {

bool fenced_code(RdKafka::ErrorCode code) {
  return code == RdKafka::ERR__FENCED || code == RdKafka::ERR_PRODUCER_FENCED ||
         code == RdKafka::ERR_INVALID_PRODUCER_EPOCH;
}

/// One transactional call's error, read out of rd_kafka_error_t (or made
/// from a produce() return code).
struct CallError {
  RdKafka::ErrorCode code = RdKafka::ERR_NO_ERROR;
  bool fatal = false;
  bool abortable = false;
  bool retriable = false;
  std::string detail;
};

CallError take(RdKafka::Error* raw) {
  std::unique_ptr<RdKafka::Error> error(raw);
  if (!error) return {};
  return CallError{error->code(), error->is_fatal(), error->txn_requires_abort(),
                   error->is_retriable(), error->str()};
}

std::string what_next(TxnAction action) {
  switch (action) {
    case TxnAction::kAbort:
      return "the transaction must be aborted and redone";
    case TxnAction::kRewind:
      return "the transaction was aborted: roll the filters back to the last committed state "
             "and rewind to the committed offsets";
    case TxnAction::kStop:
      return "stopping: the producer cannot continue (restart the instance; if it was fenced, "
             "check that no other instance uses the same transactional.id)";
    case TxnAction::kRetry:
    case TxnAction::kProceed:
      break;
  }
  return "";
}

}  // namespace

TransactionalProducer::TransactionalProducer(Options options,
                                             std::unique_ptr<RdKafka::Producer> producer)
    : options_(std::move(options)),
      producer_(std::move(producer)),
      machine_(options_.max_retries) {}

TransactionalProducer::~TransactionalProducer() {
  // Leave no transaction half-open on a clean shutdown path: an open
  // transaction would otherwise be aborted by the coordinator only after
  // transaction.timeout.ms, blocking read_committed readers until then.
  if (producer_ && machine_.state() == TxnState::kInTransaction) {
    (void)take(producer_->abort_transaction(static_cast<int>(options_.call_timeout.count())));
  }
}

Result<std::unique_ptr<TransactionalProducer>> TransactionalProducer::create(Options options) {
  if (options.transactional_id.empty()) {
    return fail("transactional producer: transactional.id is empty");
  }
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  std::string err;
  if ((options.delivery_reports != nullptr &&
       conf->set("dr_cb", options.delivery_reports, err) != RdKafka::Conf::CONF_OK) ||
      (options.events != nullptr &&
       conf->set("event_cb", options.events, err) != RdKafka::Conf::CONF_OK)) {
    return fail("transactional producer: " + err);
  }
  auto props = options.properties;
  props["transactional.id"] = options.transactional_id;
  for (const auto& [key, value] : props) {
    if (conf->set(key, value, err) != RdKafka::Conf::CONF_OK) {
      return fail(fmt::format("transactional producer: property '{}': {}", key,
                              config::kafka_property_error(key, value, err)));
    }
  }
  std::unique_ptr<RdKafka::Producer> producer(RdKafka::Producer::create(conf.get(), err));
  if (!producer) return fail("transactional producer: " + err);
  return std::unique_ptr<TransactionalProducer>(
      new TransactionalProducer(std::move(options), std::move(producer)));
}

template <class Call>
TxnOutcome TransactionalProducer::run(TxnOp op, Call&& call) {
  TxnOutcome out;
  if (!machine_.allowed(op)) {
    out.action = TxnAction::kStop;
    out.error = TxnErrorClass::kFatal;
    out.state = machine_.state();
    out.message =
        fmt::format("transactional.id {}: {} is not allowed in state {} (program error)",
                    options_.transactional_id, to_string(op), to_string(machine_.state()));
    return out;
  }
  for (;;) {
    const CallError error = call();
    TxnErrorClass cls = TxnErrorClass::kNone;
    if (error.code != RdKafka::ERR_NO_ERROR) {
      const bool fenced = fenced_code(error.code);
      cls = classify(error.fatal, error.abortable, error.retriable, fenced);
      out.error = cls;
      out.message =
          fmt::format("transactional.id {}: {} failed ({}): {}{}", options_.transactional_id,
                      to_string(op), to_string(cls), describe_kafka_error(error.code),
                      fenced ? " (fenced: a newer producer with the same "
                               "transactional.id took over)"
                             : "");
      if (!error.detail.empty()) out.message += fmt::format(" [{}]", error.detail);
    }
    out.action = machine_.on_result(op, cls);
    out.state = machine_.state();
    if (out.action != TxnAction::kRetry) break;
    ++out.retries;
    std::this_thread::sleep_for(options_.retry_backoff);
  }
  if (const std::string next = what_next(out.action); !next.empty()) {
    out.message += (out.message.empty() ? "" : "; ") + next;
  }
  return out;
}

TxnOutcome TransactionalProducer::init() {
  const int timeout = static_cast<int>(options_.call_timeout.count());
  return run(TxnOp::kInit, [&] { return take(producer_->init_transactions(timeout)); });
}

TxnOutcome TransactionalProducer::begin() {
  return run(TxnOp::kBegin, [&] { return take(producer_->begin_transaction()); });
}

TxnOutcome TransactionalProducer::produce(const std::string& topic, std::int32_t partition,
                                          std::optional<std::string_view> key,
                                          std::string_view value, std::int64_t timestamp_ms) {
  return run(TxnOp::kProduce, [&]() -> CallError {
    const RdKafka::ErrorCode code = producer_->produce(
        topic, partition < 0 ? RdKafka::Topic::PARTITION_UA : partition,
        RdKafka::Producer::RK_MSG_COPY, const_cast<char*>(value.data()), value.size(),
        key ? key->data() : nullptr, key ? key->size() : 0, timestamp_ms, nullptr);
    if (code == RdKafka::ERR_NO_ERROR) return {};
    producer_->poll(0);  // serve delivery reports so a full queue drains
    // produce() returns a plain code, not an rd_kafka_error_t: a full queue
    // is retriable, _STATE means the transaction already needs an abort (a
    // delivery failed), _FATAL is fatal, and so is anything else: the record
    // cannot be produced, and redoing the transaction would fail the same way.
    return CallError{code, code == RdKafka::ERR__FATAL, code == RdKafka::ERR__STATE,
                     code == RdKafka::ERR__QUEUE_FULL,
                     fmt::format("topic '{}' partition {}", topic, partition)};
  });
}

TxnOutcome TransactionalProducer::send_offsets(const std::vector<TxnOffset>& offsets,
                                               const RdKafka::ConsumerGroupMetadata& group) {
  std::vector<RdKafka::TopicPartition*> parts;
  parts.reserve(offsets.size());
  struct Owned {
    std::vector<RdKafka::TopicPartition*>& v;
    ~Owned() { RdKafka::TopicPartition::destroy(v); }
  } owned{parts};
  for (const auto& o : offsets) {
    parts.push_back(RdKafka::TopicPartition::create(o.topic, o.partition, o.offset));
  }
  const int timeout = static_cast<int>(options_.call_timeout.count());
  return run(TxnOp::kSendOffsets,
             [&] { return take(producer_->send_offsets_to_transaction(parts, &group, timeout)); });
}

TxnOutcome TransactionalProducer::commit() {
  const int timeout = static_cast<int>(options_.call_timeout.count());
  return run(TxnOp::kCommit, [&] { return take(producer_->commit_transaction(timeout)); });
}

TxnOutcome TransactionalProducer::abort() {
  const int timeout = static_cast<int>(options_.call_timeout.count());
  return run(TxnOp::kAbort, [&] { return take(producer_->abort_transaction(timeout)); });
}

}  // namespace kdedup::pipeline

// ---------------------------------------------------------------------------
// TxnLoop

namespace kdedup::pipeline {

namespace {

std::string list_offsets(const std::vector<TxnOffset>& offsets) {
  std::string out;
  for (const auto& o : offsets) {
    out += fmt::format("{}{}[{}]@{}", out.empty() ? "" : ", ", o.topic, o.partition, o.offset);
  }
  return out.empty() ? "(none)" : out;
}

bool contains(std::span<const TxnOffset> set, const TxnOffset& p) {
  return std::any_of(set.begin(), set.end(), [&](const TxnOffset& o) {
    return o.topic == p.topic && o.partition == p.partition;
  });
}

}  // namespace

TxnOutcome ProducerTxnCalls::send_offsets(const std::vector<TxnOffset>& offsets) {
  std::unique_ptr<RdKafka::ConsumerGroupMetadata> group(consumer_.groupMetadata());
  if (!group) {
    TxnOutcome out;
    out.action = TxnAction::kStop;
    out.error = TxnErrorClass::kFatal;
    out.state = producer_.state();
    out.message = "the consumer has no group metadata to send the offsets with (program error)";
    return out;
  }
  return producer_.send_offsets(offsets, *group);
}

Status TxnLoop::start() {
  TxnOutcome out = calls_.begin();
  if (!out.ok()) {
    stopped_ = true;
    stop_message_ = out.message;
    return fail(out.message);
  }
  open_ = true;
  host_.began();
  return {};
}

TxnLoop::Round TxnLoop::stopped(std::string message) {
  stopped_ = true;
  open_ = false;
  stop_message_ = message;
  Round round;
  round.ending = Ending::kStopped;
  round.message = std::move(message);
  return round;
}

bool TxnLoop::begin_next(Round& round) {
  TxnOutcome out = calls_.begin();
  if (!out.ok()) {
    round = stopped(out.message);
    return false;
  }
  open_ = true;
  host_.began();
  return true;
}

void TxnLoop::forget_all(std::span<const TxnOffset> leaving) {
  for (const auto& p : leaving) committed_.erase({p.topic, p.partition});
}

TxnLoop::Round TxnLoop::commit(std::span<const TxnOffset> leaving) { return end(true, leaving); }

TxnLoop::Round TxnLoop::finish() { return end(false, {}); }

TxnLoop::Round TxnLoop::abort(const std::string& why, std::span<const TxnOffset> leaving) {
  if (stopped_) return stopped(stop_message_);
  if (!open_) {
    forget_all(leaving);
    return Round{};
  }
  (void)host_.settle();  // no worker may produce into the transaction being aborted
  return abort_and_roll_back(why, leaving, true);
}

TxnLoop::Round TxnLoop::end(bool next, std::span<const TxnOffset> leaving) {
  if (stopped_) return stopped(stop_message_);
  if (!open_) {
    forget_all(leaving);
    return Round{};
  }
  // Everything of this transaction must be produced and acknowledged
  // before its offsets go in: an offset committed ahead of its output
  // would lose that output if the commit then failed half-way.
  const bool settled = host_.settle();
  if (auto why = host_.abort_reason()) return abort_and_roll_back(*why, leaving, next);
  if (!settled) {
    return abort_and_roll_back(
        "outputs of the transaction were not acknowledged within shutdown_timeout", leaving, next);
  }
  // Only positions past the last commit: a partition still replaying up to
  // it (rebuild after a rollback) must not commit an older offset.
  std::vector<TxnOffset> moved;
  for (auto& p : host_.positions()) {
    auto it = committed_.find({p.topic, p.partition});
    if (it == committed_.end() || it->second < p.offset) moved.push_back(std::move(p));
  }
  const std::uint64_t outputs = host_.open_outputs();
  Round round;
  if (moved.empty() && outputs == 0) {
    forget_all(leaving);
    if (next) return round;  // kIdle: the (empty) transaction stays open
    // Shutdown: close the empty transaction (no request is sent for it).
    TxnOutcome out = calls_.commit();
    open_ = false;
    if (out.action == TxnAction::kStop) return stopped(out.message);
    return round;
  }
  if (!moved.empty()) {
    TxnOutcome out = calls_.send_offsets(moved);
    if (out.action == TxnAction::kAbort) return abort_and_roll_back(out.message, leaving, next);
    if (!out.ok()) return stopped(out.message);
  }
  TxnOutcome out = calls_.commit();
  if (out.action == TxnAction::kAbort) return abort_and_roll_back(out.message, leaving, next);
  if (!out.ok()) return stopped(out.message);
  open_ = false;
  for (const auto& p : moved) committed_[{p.topic, p.partition}] = p.offset;
  commits_.fetch_add(1, std::memory_order_relaxed);
  records_committed_.fetch_add(outputs, std::memory_order_relaxed);
  spdlog::debug("transaction committed: {} output record(s), offsets {}", outputs,
                list_offsets(moved));
  host_.committed(moved);
  forget_all(leaving);
  round.ending = Ending::kCommitted;
  round.offsets = std::move(moved);
  if (next) (void)begin_next(round);
  return round;
}

TxnLoop::Round TxnLoop::abort_and_roll_back(const std::string& why,
                                            std::span<const TxnOffset> leaving, bool next) {
  // Where the transaction had got to, before the abort drops its output.
  const std::vector<TxnOffset> reached = host_.positions();
  const std::uint64_t outputs = host_.open_outputs();
  TxnOutcome out = calls_.abort();
  if (out.action != TxnAction::kRewind) {
    return stopped(fmt::format("{}; then aborting failed: {}", why, out.message));
  }
  open_ = false;
  aborts_.fetch_add(1, std::memory_order_relaxed);
  records_aborted_.fetch_add(outputs, std::memory_order_relaxed);
  std::vector<TxnRollback> back;
  for (const auto& p : reached) {
    if (contains(leaving, p)) continue;  // the next owner starts from the committed offset
    auto it = committed_.find({p.topic, p.partition});
    std::optional<std::int64_t> last;
    if (it != committed_.end()) last = it->second;
    if (last && *last >= p.offset) continue;  // nothing of it was in the transaction
    back.push_back(TxnRollback{p.topic, p.partition, last, p.offset});
  }
  // Each partition while there are few; with many, their ranges (one line
  // per event, whatever the partition count).
  constexpr std::size_t kListed = 8;
  std::string targets;
  std::vector<std::pair<std::string, std::int32_t>> parts;
  for (const auto& b : back) {
    parts.emplace_back(b.topic, b.partition);
    if (back.size() > kListed) continue;
    targets += fmt::format("{}{}[{}] {} -> {}", targets.empty() ? "" : ", ", b.topic, b.partition,
                           b.reached,
                           b.committed ? std::to_string(*b.committed) : "its starting position");
  }
  if (back.size() > kListed) targets = summarize_partitions(std::move(parts));
  spdlog::warn(
      "transaction aborted ({} output record(s) discarded): {}; rolling back {} partition(s) to "
      "their last committed state: {}",
      outputs, why, back.size(), targets.empty() ? "(none)" : targets);
  if (!back.empty()) {
    if (auto s = host_.roll_back(back); !s) {
      return stopped("rolling back after an aborted transaction failed: " + s.error().message);
    }
    rolled_back_.fetch_add(back.size(), std::memory_order_relaxed);
  }
  forget_all(leaving);
  Round round;
  round.ending = Ending::kRolledBack;
  round.message = why;
  if (next) (void)begin_next(round);
  return round;
}

void TxnLoop::forget(const std::string& topic, std::int32_t partition) {
  committed_.erase({topic, partition});
}

std::optional<std::int64_t> TxnLoop::committed(const std::string& topic,
                                               std::int32_t partition) const {
  auto it = committed_.find({topic, partition});
  if (it == committed_.end()) return std::nullopt;
  return it->second;
}

TxnTotals TxnLoop::totals() const noexcept {
  TxnTotals t;
  t.committed = commits_.load(std::memory_order_relaxed);
  t.aborted = aborts_.load(std::memory_order_relaxed);
  t.records_committed = records_committed_.load(std::memory_order_relaxed);
  t.records_aborted = records_aborted_.load(std::memory_order_relaxed);
  t.partitions_rolled_back = rolled_back_.load(std::memory_order_relaxed);
  return t;
}

}  // namespace kdedup::pipeline
