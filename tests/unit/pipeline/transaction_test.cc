// TxnMachine: every allowed transition, retry escalation, classification
// precedence and transactional.id derivation. No Kafka.

#include "kdedup/pipeline/transaction.h"

#include <gtest/gtest.h>

namespace kdedup::pipeline {
namespace {

using A = TxnAction;
using C = TxnErrorClass;
using O = TxnOp;
using S = TxnState;

TxnMachine in_transaction(std::uint32_t retries = 5) {
  TxnMachine m(retries);
  EXPECT_EQ(m.on_result(O::kInit, C::kNone), A::kProceed);
  EXPECT_EQ(m.on_result(O::kBegin, C::kNone), A::kProceed);
  EXPECT_EQ(m.state(), S::kInTransaction);
  return m;
}

TEST(TxnClassify, FollowsLibrdkafkaPrecedence) {
  EXPECT_EQ(classify(true, true, true, false), C::kFatal);
  EXPECT_EQ(classify(false, false, false, true), C::kFatal) << "fenced is fatal";
  EXPECT_EQ(classify(false, true, true, false), C::kAbortable) << "abort wins over retry";
  EXPECT_EQ(classify(false, true, false, false), C::kAbortable);
  EXPECT_EQ(classify(false, false, true, false), C::kRetriable);
  EXPECT_EQ(classify(false, false, false, false), C::kFatal) << "no class: usage error";
}

TEST(TxnMachine, HappyPathCycles) {
  TxnMachine m;
  EXPECT_EQ(m.state(), S::kUninitialized);
  EXPECT_TRUE(m.allowed(O::kInit));
  EXPECT_FALSE(m.allowed(O::kBegin));
  EXPECT_EQ(m.on_result(O::kInit, C::kNone), A::kProceed);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(m.state(), S::kReady);
    EXPECT_FALSE(m.allowed(O::kCommit));
    EXPECT_FALSE(m.allowed(O::kProduce));
    EXPECT_EQ(m.on_result(O::kBegin, C::kNone), A::kProceed);
    EXPECT_EQ(m.on_result(O::kProduce, C::kNone), A::kProceed);
    EXPECT_EQ(m.on_result(O::kSendOffsets, C::kNone), A::kProceed);
    EXPECT_EQ(m.state(), S::kInTransaction);
    EXPECT_FALSE(m.allowed(O::kBegin));
    EXPECT_FALSE(m.allowed(O::kInit));
    EXPECT_EQ(m.on_result(O::kCommit, C::kNone), A::kProceed);
  }
  EXPECT_EQ(m.state(), S::kReady);
}

TEST(TxnMachine, InitRetriesThenSucceeds) {
  TxnMachine m(3);
  EXPECT_EQ(m.on_result(O::kInit, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.on_result(O::kInit, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.retries(), 2u);
  EXPECT_EQ(m.state(), S::kUninitialized);
  EXPECT_EQ(m.on_result(O::kInit, C::kNone), A::kProceed);
  EXPECT_EQ(m.retries(), 0u);
  EXPECT_EQ(m.state(), S::kReady);
}

TEST(TxnMachine, InitRetriesExhaustedStops) {
  TxnMachine m(2);
  EXPECT_EQ(m.on_result(O::kInit, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.on_result(O::kInit, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.on_result(O::kInit, C::kRetriable), A::kStop);
  EXPECT_EQ(m.state(), S::kFatal);
  EXPECT_FALSE(m.allowed(O::kInit));
}

TEST(TxnMachine, InitAbortableOrFatalStops) {
  for (C c : {C::kAbortable, C::kFatal}) {
    TxnMachine m;
    EXPECT_EQ(m.on_result(O::kInit, c), A::kStop) << to_string(c);
    EXPECT_EQ(m.state(), S::kFatal);
  }
}

TEST(TxnMachine, BeginFailureIsFatal) {
  for (C c : {C::kRetriable, C::kAbortable, C::kFatal}) {
    TxnMachine m;
    ASSERT_EQ(m.on_result(O::kInit, C::kNone), A::kProceed);
    EXPECT_EQ(m.on_result(O::kBegin, c), A::kStop) << to_string(c);
    EXPECT_EQ(m.state(), S::kFatal);
  }
}

TEST(TxnMachine, AbortableInsideTransactionRequiresAbortThenRewind) {
  for (O op : {O::kProduce, O::kSendOffsets, O::kCommit}) {
    TxnMachine m = in_transaction();
    EXPECT_EQ(m.on_result(op, C::kAbortable), A::kAbort) << to_string(op);
    EXPECT_EQ(m.state(), S::kAbortRequired);
    // Only abort is allowed now: no commit, produce or begin sneaks past.
    for (O other : {O::kInit, O::kBegin, O::kProduce, O::kSendOffsets, O::kCommit}) {
      EXPECT_FALSE(m.allowed(other)) << to_string(other);
    }
    EXPECT_TRUE(m.allowed(O::kAbort));
    EXPECT_EQ(m.on_result(O::kAbort, C::kNone), A::kRewind);
    EXPECT_EQ(m.state(), S::kReady);
    EXPECT_EQ(m.on_result(O::kBegin, C::kNone), A::kProceed);
  }
}

TEST(TxnMachine, RetriableCommitRetriesSameCallThenEscalatesToAbort) {
  TxnMachine m = in_transaction(2);
  EXPECT_EQ(m.on_result(O::kCommit, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.state(), S::kInTransaction);
  EXPECT_EQ(m.on_result(O::kCommit, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.on_result(O::kCommit, C::kRetriable), A::kAbort);
  EXPECT_EQ(m.state(), S::kAbortRequired);
  EXPECT_EQ(m.on_result(O::kAbort, C::kNone), A::kRewind);
}

TEST(TxnMachine, RetryCountIsPerCall) {
  TxnMachine m = in_transaction(1);
  EXPECT_EQ(m.on_result(O::kSendOffsets, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.on_result(O::kSendOffsets, C::kNone), A::kProceed);
  // A new call starts with a fresh budget.
  EXPECT_EQ(m.on_result(O::kCommit, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.on_result(O::kCommit, C::kNone), A::kProceed);
}

TEST(TxnMachine, FatalAnywhereStops) {
  for (O op : {O::kProduce, O::kSendOffsets, O::kCommit, O::kAbort}) {
    TxnMachine m = in_transaction();
    EXPECT_EQ(m.on_result(op, C::kFatal), A::kStop) << to_string(op);
    EXPECT_EQ(m.state(), S::kFatal);
    for (O other : {O::kInit, O::kBegin, O::kProduce, O::kSendOffsets, O::kCommit, O::kAbort}) {
      EXPECT_FALSE(m.allowed(other));
    }
  }
}

TEST(TxnMachine, AbortRetriesAndFailures) {
  TxnMachine m = in_transaction(1);
  ASSERT_EQ(m.on_result(O::kCommit, C::kAbortable), A::kAbort);
  EXPECT_EQ(m.on_result(O::kAbort, C::kRetriable), A::kRetry);
  EXPECT_EQ(m.on_result(O::kAbort, C::kRetriable), A::kStop) << "an abort that never ends";
  EXPECT_EQ(m.state(), S::kFatal);

  TxnMachine m2 = in_transaction();
  ASSERT_EQ(m2.on_result(O::kSendOffsets, C::kAbortable), A::kAbort);
  EXPECT_EQ(m2.on_result(O::kAbort, C::kAbortable), A::kStop);
}

TEST(TxnMachine, VoluntaryAbortRewinds) {
  TxnMachine m = in_transaction();
  EXPECT_EQ(m.on_result(O::kAbort, C::kNone), A::kRewind);
  EXPECT_EQ(m.state(), S::kReady);
}

TEST(TxnMachine, DisallowedCallIsFatal) {
  TxnMachine m;
  EXPECT_EQ(m.on_result(O::kCommit, C::kNone), A::kStop);
  EXPECT_EQ(m.state(), S::kFatal);
}

TEST(TxnNames, AllDistinct) {
  EXPECT_STREQ(to_string(S::kAbortRequired), "abort_required");
  EXPECT_STREQ(to_string(O::kSendOffsets), "send_offsets_to_transaction");
  EXPECT_STREQ(to_string(C::kAbortable), "abortable");
  EXPECT_STREQ(to_string(A::kRewind), "rewind");
}

TEST(TransactionalId, FromGroupAndInstance) {
  auto id = transactional_id("orders-dedup", "kdedup-2");
  ASSERT_TRUE(id) << id.error().message;
  EXPECT_EQ(*id, "orders-dedup-kdedup-2");
  auto no_group = transactional_id("", "kdedup-2");
  ASSERT_FALSE(no_group);
  EXPECT_NE(no_group.error().message.find("group id"), std::string::npos);
  auto no_instance = transactional_id("g", "");
  ASSERT_FALSE(no_instance);
  EXPECT_NE(no_instance.error().message.find("group.instance.id"), std::string::npos);
  EXPECT_FALSE(transactional_id("g", std::string(40000, 'x')));
}

TEST(TransactionalProducer, CreateRejectsBadPropertyAndEmptyId) {
  TransactionalProducer::Options o;
  o.transactional_id = "g-1";
  o.properties = {{"no.such.property", "1"}};
  auto p = TransactionalProducer::create(o);
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message.find("no.such.property"), std::string::npos);
  o.properties.clear();
  o.transactional_id.clear();
  EXPECT_FALSE(TransactionalProducer::create(o));
}

TEST(TransactionalProducer, CallOutOfOrderIsRefusedWithoutNetwork) {
  TransactionalProducer::Options o;
  o.transactional_id = "g-1";
  o.properties = {{"bootstrap.servers", "127.0.0.1:1"}};
  auto p = TransactionalProducer::create(o);
  ASSERT_TRUE(p) << p.error().message;
  TxnOutcome out = (*p)->commit();
  EXPECT_EQ(out.action, A::kStop);
  EXPECT_NE(out.message.find("not allowed in state uninitialized"), std::string::npos)
      << out.message;
}

}  // namespace
}  // namespace kdedup::pipeline
