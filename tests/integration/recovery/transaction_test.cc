// TransactionalProducer against the test broker with errors injected through
// its control channel: a clean transaction, a voluntary abort, and the
// retriable / abortable / fatal (fenced) paths of init, send_offsets and
// commit, each checked for the classification and the action reported.
//
// The mock cluster writes no transaction markers and does not store offsets
// sent in a transaction (DESIGN.md "Known limits of the test broker"), so
// these tests check what the producer reports, not read_committed visibility
// or the group's committed offsets; the state machine itself is covered by
// tests/unit/pipeline/transaction_test.cc.

#include "kdedup/pipeline/transaction.h"

#include <gtest/gtest.h>
#include <librdkafka/rdkafkacpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "broker.h"

namespace kdedup::pipeline {
namespace {

using namespace std::chrono_literals;
using testing::TestBroker;

class TransactionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2"}});
    ASSERT_TRUE(b) << b.error().message;
    broker_ = std::move(*b);
  }

  std::unique_ptr<TransactionalProducer> producer(std::chrono::milliseconds call_timeout = 10s,
                                                  std::uint32_t max_retries = 5) {
    TransactionalProducer::Options o;
    o.properties = {{"bootstrap.servers", broker_->bootstrap()},
                    {"transaction.timeout.ms", "60000"}};
    o.transactional_id = *transactional_id("txn-group", "member-" + std::to_string(next_id_++));
    o.call_timeout = call_timeout;
    o.max_retries = max_retries;
    o.retry_backoff = 50ms;
    auto p = TransactionalProducer::create(o);
    EXPECT_TRUE(p) << p.error().message;
    return p ? std::move(*p) : nullptr;
  }

  /// The group metadata send_offsets needs, from a consumer of the group.
  std::unique_ptr<RdKafka::ConsumerGroupMetadata> group_metadata() {
    std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
    std::string err;
    conf->set("bootstrap.servers", broker_->bootstrap(), err);
    conf->set("group.id", "txn-group", err);
    consumer_.reset(RdKafka::KafkaConsumer::create(conf.get(), err));
    EXPECT_TRUE(consumer_) << err;
    return std::unique_ptr<RdKafka::ConsumerGroupMetadata>(consumer_->groupMetadata());
  }

  void control(const std::string& command) {
    auto r = broker_->control(command);
    ASSERT_TRUE(r) << command << ": " << r.error().message;
  }

  std::unique_ptr<TestBroker> broker_;
  std::unique_ptr<RdKafka::KafkaConsumer> consumer_;
  int next_id_ = 0;
};

void expect(const TxnOutcome& out, TxnAction action, TxnErrorClass error, const char* what) {
  EXPECT_EQ(out.action, action) << what << ": got " << to_string(out.action) << " / "
                                << to_string(out.error) << ": " << out.message;
  EXPECT_EQ(out.error, error) << what << ": " << out.message;
}

TEST_F(TransactionTest, CommitsOutputAndOffsets) {
  auto p = producer();
  ASSERT_TRUE(p);
  auto group = group_metadata();
  ASSERT_TRUE(group);
  expect(p->init(), TxnAction::kProceed, TxnErrorClass::kNone, "init");
  for (int txn = 0; txn < 2; ++txn) {
    expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
    for (int i = 0; i < 3; ++i) {
      expect(p->produce("out", txn, "k" + std::to_string(i), "v"), TxnAction::kProceed,
             TxnErrorClass::kNone, "produce");
    }
    expect(p->send_offsets({{"in", txn, 10 + txn}}, *group), TxnAction::kProceed,
           TxnErrorClass::kNone, "send_offsets");
    auto out = p->commit();
    expect(out, TxnAction::kProceed, TxnErrorClass::kNone, "commit");
    EXPECT_TRUE(out.message.empty()) << out.message;
    EXPECT_EQ(p->state(), TxnState::kReady);
  }
  auto records = broker_->read_topic("out");
  ASSERT_TRUE(records) << records.error().message;
  EXPECT_EQ(records->size(), 6u);
}

TEST_F(TransactionTest, VoluntaryAbortAsksForRewind) {
  auto p = producer();
  ASSERT_TRUE(p);
  expect(p->init(), TxnAction::kProceed, TxnErrorClass::kNone, "init");
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
  expect(p->produce("out", 0, "k", "v"), TxnAction::kProceed, TxnErrorClass::kNone, "produce");
  auto out = p->abort();
  expect(out, TxnAction::kRewind, TxnErrorClass::kNone, "abort");
  EXPECT_NE(out.message.find("rewind to the committed offsets"), std::string::npos) << out.message;
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin after abort");
  expect(p->commit(), TxnAction::kProceed, TxnErrorClass::kNone, "commit after abort");
}

TEST_F(TransactionTest, InitFatalErrorStops) {
  control("errors InitProducerId 1 TRANSACTIONAL_ID_AUTHORIZATION_FAILED");
  auto p = producer();
  ASSERT_TRUE(p);
  auto out = p->init();
  expect(out, TxnAction::kStop, TxnErrorClass::kFatal, "init");
  EXPECT_EQ(p->state(), TxnState::kFatal);
  EXPECT_NE(out.message.find("init_transactions"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find("stopping"), std::string::npos) << out.message;
  // Nothing further is allowed.
  expect(p->begin(), TxnAction::kStop, TxnErrorClass::kFatal, "begin after fatal");
}

TEST_F(TransactionTest, InitTimeoutIsRetriedUntilTheCoordinatorAnswers) {
  // Responses are slow, each init_transactions call waits 0.5 s: the first
  // calls time out (retriable) and are retried; a later one sees the answer.
  control("rtt 1 1500");
  auto p = producer(500ms, 30);
  ASSERT_TRUE(p);
  auto out = p->init();
  expect(out, TxnAction::kProceed, TxnErrorClass::kRetriable, "init");
  EXPECT_GE(out.retries, 1u) << out.message;
  EXPECT_EQ(p->state(), TxnState::kReady);
  control("rtt 1 0");
}

TEST_F(TransactionTest, AbortableSendOffsetsRequiresAbortThenRewind) {
  auto p = producer();
  ASSERT_TRUE(p);
  auto group = group_metadata();
  expect(p->init(), TxnAction::kProceed, TxnErrorClass::kNone, "init");
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
  expect(p->produce("out", 0, "k", "v"), TxnAction::kProceed, TxnErrorClass::kNone, "produce");
  control("errors AddOffsetsToTxn 1 GROUP_AUTHORIZATION_FAILED");
  auto out = p->send_offsets({{"in", 0, 5}}, *group);
  expect(out, TxnAction::kAbort, TxnErrorClass::kAbortable, "send_offsets");
  EXPECT_EQ(p->state(), TxnState::kAbortRequired);
  EXPECT_NE(out.message.find("must be aborted"), std::string::npos) << out.message;
  // commit is refused before the abort.
  expect(p->commit(), TxnAction::kStop, TxnErrorClass::kFatal, "commit while abort required");
  EXPECT_EQ(p->state(), TxnState::kAbortRequired) << "a refused call changes nothing";
  expect(p->abort(), TxnAction::kRewind, TxnErrorClass::kNone, "abort");
  // The redo succeeds.
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
  expect(p->send_offsets({{"in", 0, 5}}, *group), TxnAction::kProceed, TxnErrorClass::kNone,
         "send_offsets again");
  expect(p->commit(), TxnAction::kProceed, TxnErrorClass::kNone, "commit");
}

TEST_F(TransactionTest, CoordinatorHiccupsOnEndTxnAreRetriedInsideLibrdkafka) {
  auto p = producer();
  ASSERT_TRUE(p);
  expect(p->init(), TxnAction::kProceed, TxnErrorClass::kNone, "init");
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
  expect(p->produce("out", 1, "k", "v"), TxnAction::kProceed, TxnErrorClass::kNone, "produce");
  control("errors EndTxn 3 COORDINATOR_LOAD_IN_PROGRESS CONCURRENT_TRANSACTIONS NOT_COORDINATOR");
  expect(p->commit(), TxnAction::kProceed, TxnErrorClass::kNone, "commit");
}

TEST_F(TransactionTest, CommitTimeoutIsRetriable) {
  auto p = producer(500ms, 30);
  ASSERT_TRUE(p);
  expect(p->init(), TxnAction::kProceed, TxnErrorClass::kNone, "init");
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
  expect(p->produce("out", 1, "k", "v"), TxnAction::kProceed, TxnErrorClass::kNone, "produce");
  control("rtt 1 1500");
  auto out = p->commit();
  expect(out, TxnAction::kProceed, TxnErrorClass::kRetriable, "commit");
  EXPECT_GE(out.retries, 1u);
  EXPECT_EQ(p->state(), TxnState::kReady);
  control("rtt 1 0");
}

TEST_F(TransactionTest, FencedCommitStops) {
  auto p = producer();
  ASSERT_TRUE(p);
  expect(p->init(), TxnAction::kProceed, TxnErrorClass::kNone, "init");
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
  expect(p->produce("out", 0, "k", "v"), TxnAction::kProceed, TxnErrorClass::kNone, "produce");
  control("errors EndTxn 1 PRODUCER_FENCED");
  auto out = p->commit();
  expect(out, TxnAction::kStop, TxnErrorClass::kFatal, "commit");
  EXPECT_EQ(p->state(), TxnState::kFatal);
  EXPECT_NE(out.message.find("fenced"), std::string::npos) << out.message;
  EXPECT_NE(out.message.find(p->id()), std::string::npos) << out.message;
}

TEST_F(TransactionTest, AbortableCommitRequiresAbort) {
  auto p = producer();
  ASSERT_TRUE(p);
  expect(p->init(), TxnAction::kProceed, TxnErrorClass::kNone, "init");
  expect(p->begin(), TxnAction::kProceed, TxnErrorClass::kNone, "begin");
  expect(p->produce("out", 0, "k", "v"), TxnAction::kProceed, TxnErrorClass::kNone, "produce");
  // A permanent produce error inside a transaction fails the transaction,
  // not the producer: commit reports it as abortable.
  control("errors Produce 1 TOPIC_AUTHORIZATION_FAILED");
  expect(p->produce("out", 1, "k2", "v"), TxnAction::kProceed, TxnErrorClass::kNone, "produce");
  auto out = p->commit();
  expect(out, TxnAction::kAbort, TxnErrorClass::kAbortable, "commit");
  expect(p->abort(), TxnAction::kRewind, TxnErrorClass::kNone, "abort");
}

}  // namespace
}  // namespace kdedup::pipeline
