// TxnLoop: the transaction loop of delivery: transactional against a
// scripted producer and a fake pipeline. Checks what is committed, what is
// rolled back to which offsets after an abort, what a fatal error stops, and
// the counters. No Kafka.

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "kdedup/pipeline/transaction.h"

namespace kdedup::pipeline {
namespace {

/// Each call pops the next scripted outcome (a clean success when none is
/// left) and records itself.
class ScriptedCalls final : public TxnCalls {
 public:
  std::deque<TxnOutcome> begin_results, send_results, commit_results, abort_results;
  std::vector<std::string> log;
  std::vector<std::vector<TxnOffset>> sent;

  TxnOutcome begin() override { return next("begin", begin_results); }
  TxnOutcome send_offsets(const std::vector<TxnOffset>& offsets) override {
    sent.push_back(offsets);
    return next("send_offsets", send_results);
  }
  TxnOutcome commit() override { return next("commit", commit_results); }
  TxnOutcome abort() override {
    TxnOutcome out = next("abort", abort_results);
    // A clean abort asks for the rewind, as TransactionalProducer does.
    if (out.error == TxnErrorClass::kNone) out.action = TxnAction::kRewind;
    return out;
  }

 private:
  TxnOutcome next(const char* op, std::deque<TxnOutcome>& results) {
    log.emplace_back(op);
    if (results.empty()) return TxnOutcome{};
    TxnOutcome out = results.front();
    results.pop_front();
    return out;
  }
};

TxnOutcome failed(TxnAction action, TxnErrorClass error, std::string message) {
  TxnOutcome out;
  out.action = action;
  out.error = error;
  out.message = std::move(message);
  return out;
}

/// A pipeline with partitions at given positions.
class FakeHost final : public TxnHost {
 public:
  std::map<std::pair<std::string, std::int32_t>, std::int64_t> position;
  std::uint64_t outputs = 0;
  std::optional<std::string> doomed;
  bool settles = true;
  int settled = 0, begun = 0;
  std::vector<std::vector<TxnOffset>> commits;
  std::vector<std::vector<TxnRollback>> rollbacks;
  Status rollback_result;

  bool settle() override {
    ++settled;
    return settles;
  }
  std::vector<TxnOffset> positions() override {
    std::vector<TxnOffset> out;
    for (const auto& [key, offset] : position) out.push_back({key.first, key.second, offset});
    return out;
  }
  std::uint64_t open_outputs() override { return outputs; }
  std::optional<std::string> abort_reason() override { return doomed; }
  void began() override {
    ++begun;
    outputs = 0;
    doomed.reset();
  }
  void committed(const std::vector<TxnOffset>& offsets) override { commits.push_back(offsets); }
  Status roll_back(const std::vector<TxnRollback>& partitions) override {
    rollbacks.push_back(partitions);
    // The fake rewinds like the pipeline: positions back to the target.
    for (const auto& p : partitions) {
      if (p.committed) {
        position[{p.topic, p.partition}] = *p.committed;
      } else {
        position.erase({p.topic, p.partition});
      }
    }
    return rollback_result;
  }
};

std::vector<std::int64_t> offsets_of(const std::vector<TxnOffset>& v) {
  std::vector<std::int64_t> out;
  for (const auto& o : v) out.push_back(o.offset);
  return out;
}

class TxnLoopTest : public ::testing::Test {
 protected:
  ScriptedCalls calls;
  FakeHost host;
  TxnLoop loop{calls, host};

  void SetUp() override { ASSERT_TRUE(loop.start()); }
};

TEST_F(TxnLoopTest, CommitsMovedPositionsWithTheirOutputAndBeginsTheNext) {
  EXPECT_EQ(host.begun, 1);
  host.position[{"in", 0}] = 10;
  host.position[{"in", 1}] = 4;
  host.outputs = 7;
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kCommitted) << round.message;
  EXPECT_EQ(calls.log, (std::vector<std::string>{"begin", "send_offsets", "commit", "begin"}));
  ASSERT_EQ(calls.sent.size(), 1u);
  EXPECT_EQ(offsets_of(calls.sent[0]), (std::vector<std::int64_t>{10, 4}));
  ASSERT_EQ(host.commits.size(), 1u) << "the committed signal follows a successful commit";
  EXPECT_EQ(offsets_of(host.commits[0]), (std::vector<std::int64_t>{10, 4}));
  EXPECT_EQ(host.begun, 2);
  EXPECT_EQ(loop.committed("in", 0), 10);
  auto t = loop.totals();
  EXPECT_EQ(t.committed, 1u);
  EXPECT_EQ(t.records_committed, 7u);
  EXPECT_EQ(t.aborted, 0u);

  // Only partition 1 moves: only it is sent.
  host.position[{"in", 1}] = 9;
  host.outputs = 2;
  round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kCommitted);
  ASSERT_EQ(calls.sent.size(), 2u);
  ASSERT_EQ(calls.sent[1].size(), 1u);
  EXPECT_EQ(calls.sent[1][0].partition, 1);
  EXPECT_EQ(loop.totals().records_committed, 9u);
}

TEST_F(TxnLoopTest, NothingNewKeepsTheTransactionOpen) {
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kIdle);
  EXPECT_EQ(calls.log, (std::vector<std::string>{"begin"}));
  EXPECT_EQ(host.settled, 1);
  EXPECT_EQ(loop.totals().committed, 0u);
}

TEST_F(TxnLoopTest, AnOlderPositionThanTheCommittedOneIsNeverSent) {
  host.position[{"in", 0}] = 10;
  ASSERT_EQ(loop.commit().ending, TxnLoop::Ending::kCommitted);
  host.position[{"in", 0}] = 6;  // replaying up to the committed offset
  EXPECT_EQ(loop.commit().ending, TxnLoop::Ending::kIdle);
  EXPECT_EQ(calls.sent.size(), 1u);
}

TEST_F(TxnLoopTest, AbortableSendOffsetsAbortsAndRollsBackToTheLastCommit) {
  host.position[{"in", 0}] = 10;
  host.position[{"in", 1}] = 3;
  host.outputs = 5;
  ASSERT_EQ(loop.commit().ending, TxnLoop::Ending::kCommitted);
  host.position[{"in", 0}] = 25;
  host.position[{"in", 2}] = 8;  // never committed by this member
  host.outputs = 11;
  calls.send_results.push_back(
      failed(TxnAction::kAbort, TxnErrorClass::kAbortable, "GROUP_AUTHORIZATION_FAILED"));
  calls.log.clear();
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kRolledBack);
  EXPECT_NE(round.message.find("GROUP_AUTHORIZATION_FAILED"), std::string::npos);
  EXPECT_EQ(calls.log, (std::vector<std::string>{"send_offsets", "abort", "begin"}));
  ASSERT_EQ(host.rollbacks.size(), 1u);
  const auto& back = host.rollbacks[0];
  // Partition 1 did not move: it keeps its state. 0 goes back to 10 (not
  // to 25), 2 to where it started.
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].partition, 0);
  EXPECT_EQ(back[0].committed, 10);
  EXPECT_EQ(back[0].reached, 25);
  EXPECT_EQ(back[1].partition, 2);
  EXPECT_EQ(back[1].committed, std::nullopt);
  EXPECT_EQ(host.commits.size(), 1u) << "no committed signal for the aborted transaction";
  auto t = loop.totals();
  EXPECT_EQ(t.aborted, 1u);
  EXPECT_EQ(t.records_aborted, 11u);
  EXPECT_EQ(t.records_committed, 5u);
  EXPECT_EQ(t.partitions_rolled_back, 2u);
  EXPECT_EQ(loop.committed("in", 0), 10) << "the rollback target stays the committed offset";

  // The redo commits what the redo reached.
  host.position[{"in", 0}] = 25;
  host.outputs = 11;
  round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kCommitted);
  EXPECT_EQ(loop.committed("in", 0), 25);
  EXPECT_EQ(loop.totals().records_committed, 16u);
}

TEST_F(TxnLoopTest, AbortableCommitAbortsToo) {
  host.position[{"in", 0}] = 4;
  calls.commit_results.push_back(
      failed(TxnAction::kAbort, TxnErrorClass::kAbortable, "delivery failed"));
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kRolledBack);
  ASSERT_EQ(host.rollbacks.size(), 1u);
  EXPECT_EQ(host.rollbacks[0][0].committed, std::nullopt);
  EXPECT_EQ(host.rollbacks[0][0].reached, 4);
  EXPECT_TRUE(host.commits.empty());
}

TEST_F(TxnLoopTest, ADoomedTransactionIsAbortedWithoutSendingOffsets) {
  host.position[{"in", 0}] = 4;
  host.doomed = "could not deliver the output record for input in[0]@3";
  calls.log.clear();
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kRolledBack);
  EXPECT_EQ(round.message, "could not deliver the output record for input in[0]@3");
  EXPECT_EQ(calls.log, (std::vector<std::string>{"abort", "begin"}));
  EXPECT_FALSE(host.doomed) << "the next transaction starts clean";
}

TEST_F(TxnLoopTest, UnacknowledgedOutputsAbort) {
  host.position[{"in", 0}] = 4;
  host.settles = false;
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kRolledBack);
  EXPECT_NE(round.message.find("not acknowledged"), std::string::npos) << round.message;
}

TEST_F(TxnLoopTest, FencedCommitStopsAndNothingFollows) {
  host.position[{"in", 0}] = 4;
  calls.commit_results.push_back(
      failed(TxnAction::kStop, TxnErrorClass::kFatal, "commit_transaction failed (fenced)"));
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kStopped);
  EXPECT_NE(round.message.find("fenced"), std::string::npos);
  EXPECT_TRUE(host.commits.empty());
  EXPECT_TRUE(host.rollbacks.empty()) << "a fatal error is not rolled back: the service stops";
  calls.log.clear();
  host.position[{"in", 0}] = 9;
  EXPECT_EQ(loop.commit().ending, TxnLoop::Ending::kStopped);
  EXPECT_EQ(loop.finish().ending, TxnLoop::Ending::kStopped);
  EXPECT_TRUE(calls.log.empty()) << "no call after a fatal outcome";
}

TEST_F(TxnLoopTest, FailedAbortStops) {
  host.position[{"in", 0}] = 4;
  calls.send_results.push_back(failed(TxnAction::kAbort, TxnErrorClass::kAbortable, "abortable"));
  calls.abort_results.push_back(failed(TxnAction::kStop, TxnErrorClass::kFatal, "abort timed out"));
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kStopped);
  EXPECT_NE(round.message.find("abortable; then aborting failed: abort timed out"),
            std::string::npos)
      << round.message;
}

TEST_F(TxnLoopTest, FailedRollbackStops) {
  host.position[{"in", 0}] = 4;
  host.doomed = "x";
  host.rollback_result = fail("cannot rewind in[0]");
  auto round = loop.commit();
  EXPECT_EQ(round.ending, TxnLoop::Ending::kStopped);
  EXPECT_NE(round.message.find("cannot rewind in[0]"), std::string::npos) << round.message;
}

TEST_F(TxnLoopTest, RevokedPartitionsAreCommittedThenForgotten) {
  host.position[{"in", 0}] = 4;
  host.position[{"in", 1}] = 6;
  const std::vector<TxnOffset> leaving{{"in", 1, 0}};
  auto round = loop.commit(leaving);
  EXPECT_EQ(round.ending, TxnLoop::Ending::kCommitted);
  EXPECT_EQ(calls.sent.at(0).size(), 2u) << "the revoked partition's position is in the commit";
  EXPECT_EQ(loop.committed("in", 0), 4);
  EXPECT_EQ(loop.committed("in", 1), std::nullopt);
}

TEST_F(TxnLoopTest, RevokedPartitionsAreNotRolledBackWhenTheCommitFails) {
  host.position[{"in", 0}] = 4;
  host.position[{"in", 1}] = 6;
  calls.commit_results.push_back(failed(TxnAction::kAbort, TxnErrorClass::kAbortable, "x"));
  const std::vector<TxnOffset> leaving{{"in", 1, 0}};
  auto round = loop.commit(leaving);
  EXPECT_EQ(round.ending, TxnLoop::Ending::kRolledBack);
  ASSERT_EQ(host.rollbacks.size(), 1u);
  ASSERT_EQ(host.rollbacks[0].size(), 1u);
  EXPECT_EQ(host.rollbacks[0][0].partition, 0);
}

TEST_F(TxnLoopTest, LostPartitionsAbortTheTransaction) {
  host.position[{"in", 0}] = 4;
  ASSERT_EQ(loop.commit().ending, TxnLoop::Ending::kCommitted);
  host.position[{"in", 0}] = 8;
  host.position[{"in", 1}] = 6;
  const std::vector<TxnOffset> lost{{"in", 1, 0}};
  calls.log.clear();
  auto round = loop.abort("partitions lost: in[1]", lost);
  EXPECT_EQ(round.ending, TxnLoop::Ending::kRolledBack);
  EXPECT_EQ(calls.log, (std::vector<std::string>{"abort", "begin"}));
  ASSERT_EQ(host.rollbacks.size(), 1u);
  ASSERT_EQ(host.rollbacks[0].size(), 1u);
  EXPECT_EQ(host.rollbacks[0][0].partition, 0);
  EXPECT_EQ(host.rollbacks[0][0].committed, 4);
}

TEST_F(TxnLoopTest, FinishCommitsAndBeginsNothing) {
  host.position[{"in", 0}] = 4;
  calls.log.clear();
  EXPECT_EQ(loop.finish().ending, TxnLoop::Ending::kCommitted);
  EXPECT_EQ(calls.log, (std::vector<std::string>{"send_offsets", "commit"}));
  // The revocations of close() find no transaction open.
  host.position[{"in", 0}] = 9;
  EXPECT_EQ(loop.commit().ending, TxnLoop::Ending::kIdle);
  EXPECT_EQ(calls.log.size(), 2u);
}

TEST_F(TxnLoopTest, FinishClosesAnEmptyTransaction) {
  calls.log.clear();
  EXPECT_EQ(loop.finish().ending, TxnLoop::Ending::kIdle);
  EXPECT_EQ(calls.log, (std::vector<std::string>{"commit"}));
  EXPECT_EQ(loop.totals().committed, 0u) << "an empty transaction is not counted";
}

TEST(TxnLoop, FailedBeginStopsTheStart) {
  ScriptedCalls calls;
  FakeHost host;
  calls.begin_results.push_back(failed(TxnAction::kStop, TxnErrorClass::kFatal, "fenced"));
  TxnLoop loop(calls, host);
  auto s = loop.start();
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message, "fenced");
  EXPECT_EQ(loop.commit().ending, TxnLoop::Ending::kStopped);
}

}  // namespace
}  // namespace kdedup::pipeline
