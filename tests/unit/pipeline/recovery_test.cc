// RecoveryPlan: every branch, the S <= C invariant, rebuild_until =
// max(C, H + 1), input validation; SnapshotGate; parse_provenance and the
// output partitions to read. No Kafka.

#include "kdedup/pipeline/recovery.h"

#include <thread>

#include <gtest/gtest.h>

#include "kdedup/pipeline/reconcile.h"

namespace kdedup::pipeline {
namespace {

using Source = RecoveryPlan::FilterSource;

RecoveryInputs inputs() {
  RecoveryInputs in;
  in.partition = {"orders", 3};
  in.window_ms = 60'000;
  return in;
}

SnapshotOffer snapshot_at(std::int64_t s, std::int64_t clock = 1'000) {
  SnapshotOffer o;
  o.snapshot = SnapshotOffer::Position{s, clock};
  return o;
}

SnapshotOffer refused(SnapshotRefusal r, std::string msg = {}) {
  SnapshotOffer o;
  o.refusal = r;
  o.message = std::move(msg);
  return o;
}

TEST(RecoveryPlan, RestoresSnapshotAtCommit) {
  auto in = inputs();
  in.snapshot = snapshot_at(100, 5'000);
  in.committed = 100;
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(plan->filter, Source::kRestored);
  EXPECT_EQ(plan->clock_ms, 5'000);
  EXPECT_EQ(plan->fetch_from, 100);
  EXPECT_EQ(plan->rebuild_until, 100);
  EXPECT_EQ(plan->reason, RecoveryReason::kRestored);
  EXPECT_FALSE(plan->snapshot_refusal);
  EXPECT_NE(plan->explanation.find("orders[3]"), std::string::npos) << plan->explanation;
}

TEST(RecoveryPlan, RestoresOlderSnapshotAndReplaysToCommit) {
  auto in = inputs();
  in.snapshot = snapshot_at(40);
  in.committed = 100;
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->filter, Source::kRestored);
  EXPECT_EQ(plan->fetch_from, 40);
  EXPECT_EQ(plan->rebuild_until, 100);
}

TEST(RecoveryPlan, ReconciledOutputExtendsRebuild) {
  auto in = inputs();
  in.snapshot = snapshot_at(40);
  in.committed = 100;
  in.highest_emitted = 149;  // produced but the commit was lost in a crash
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->fetch_from, 40);
  EXPECT_EQ(plan->rebuild_until, 150);
  EXPECT_NE(plan->explanation.find("149"), std::string::npos);

  in.highest_emitted = 10;  // older than C: C wins
  plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->rebuild_until, 100);

  in.highest_emitted = 99;  // exactly up to C
  plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->rebuild_until, 100);
}

TEST(RecoveryPlan, SnapshotAheadOfCommitIsRefused) {
  auto in = inputs();
  in.snapshot = snapshot_at(101, 9'000);
  in.committed = 100;
  in.window_start_offset = 20;
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->filter, Source::kEmpty);
  EXPECT_EQ(plan->clock_ms, 0) << "the refused snapshot's clock must not leak";
  EXPECT_EQ(plan->snapshot_refusal, SnapshotRefusal::kAheadOfCommit);
  EXPECT_EQ(plan->reason, RecoveryReason::kRebuildFromWindow);
  EXPECT_EQ(plan->fetch_from, 20);
  EXPECT_EQ(plan->rebuild_until, 100);
  EXPECT_NE(plan->explanation.find("ahead of the committed offset 100"), std::string::npos)
      << plan->explanation;
}

TEST(RecoveryPlan, SnapshotWithoutAnyCommitIsRefused) {
  auto in = inputs();
  in.snapshot = snapshot_at(5);
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->filter, Source::kEmpty);
  EXPECT_EQ(plan->snapshot_refusal, SnapshotRefusal::kAheadOfCommit);
  EXPECT_EQ(plan->reason, RecoveryReason::kFreshPartition);
  EXPECT_FALSE(plan->fetch_from);
  EXPECT_EQ(plan->rebuild_until, 0);
  // Says so in words, not "committed offset none"; "ahead" stays for log readers.
  EXPECT_NE(plan->explanation.find("ahead"), std::string::npos) << plan->explanation;
  EXPECT_NE(plan->explanation.find("the group has no committed offset for it"), std::string::npos)
      << plan->explanation;
  EXPECT_EQ(plan->explanation.find("none"), std::string::npos) << plan->explanation;
}

TEST(RecoveryPlan, NeverRestoresAheadOfCommitProperty) {
  // For every combination the plan never restores S > C, never fetches past
  // C, and always replays at least to C and past H.
  for (std::int64_t s = 0; s < 12; s += 3) {
    for (std::int64_t c = -1; c < 12; c += 2) {
      for (std::int64_t h = -1; h < 14; h += 5) {
        for (std::int64_t w = -1; w < 14; w += 7) {
          auto in = inputs();
          in.snapshot = snapshot_at(s);
          if (c >= 0) in.committed = c;
          if (h >= 0) in.highest_emitted = h;
          if (w >= 0) in.window_start_offset = w;
          auto plan = plan_recovery(in);
          ASSERT_TRUE(plan);
          if (plan->filter == Source::kRestored) {
            ASSERT_TRUE(in.committed);
            EXPECT_LE(s, c);
          }
          if (plan->fetch_from && in.committed) {
            EXPECT_LE(*plan->fetch_from, c);
          }
          EXPECT_GE(plan->rebuild_until, std::max<std::int64_t>(c, 0));
          if (h >= 0) {
            EXPECT_GT(plan->rebuild_until, h);
          }
        }
      }
    }
  }
}

TEST(RecoveryPlan, EveryStoreRefusalRebuildsFromWindow) {
  for (auto r : {SnapshotRefusal::kMissing, SnapshotRefusal::kCorrupt,
                 SnapshotRefusal::kConfigChanged, SnapshotRefusal::kFormatUnknown,
                 SnapshotRefusal::kReadError, SnapshotRefusal::kConfirmStore}) {
    auto in = inputs();
    in.snapshot = refused(r, "chunk 3 of orders/3 fails its checksum");
    in.committed = 500;
    in.window_start_offset = 420;
    auto plan = plan_recovery(in);
    ASSERT_TRUE(plan);
    EXPECT_EQ(plan->filter, Source::kEmpty);
    EXPECT_EQ(plan->snapshot_refusal, r);
    EXPECT_EQ(plan->fetch_from, 420);
    EXPECT_EQ(plan->rebuild_until, 500);
    EXPECT_EQ(plan->reason, RecoveryReason::kRebuildFromWindow);
    if (r != SnapshotRefusal::kMissing) {
      EXPECT_NE(plan->explanation.find(to_string(r)), std::string::npos) << plan->explanation;
      EXPECT_NE(plan->explanation.find("checksum"), std::string::npos);
    }
  }
}

TEST(RecoveryPlan, WindowStartPastCommitIsClamped) {
  auto in = inputs();
  in.snapshot = refused(SnapshotRefusal::kMissing);
  in.committed = 50;
  in.window_start_offset = 70;
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->fetch_from, 50);
}

TEST(RecoveryPlan, NoHistoryStartsEmptyAtCommit) {
  auto in = inputs();
  in.snapshot = refused(SnapshotRefusal::kMissing);
  in.committed = 77;
  in.highest_emitted = 80;
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->reason, RecoveryReason::kNoHistory);
  EXPECT_EQ(plan->fetch_from, 77);
  EXPECT_EQ(plan->rebuild_until, 81);
}

TEST(RecoveryPlan, FreshPartition) {
  auto in = inputs();
  in.snapshot = refused(SnapshotRefusal::kMissing);
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->reason, RecoveryReason::kFreshPartition);
  EXPECT_FALSE(plan->fetch_from);
  EXPECT_EQ(plan->rebuild_until, 0);

  // Output already has records of a run that never committed.
  in.highest_emitted = 9;
  plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_FALSE(plan->fetch_from);
  EXPECT_EQ(plan->rebuild_until, 10);
  EXPECT_NE(plan->explanation.find("rebuild mode"), std::string::npos);
}

// Snapshot older than the input's retention (S < L): records [S, L) cannot be
// replayed, so the filter would miss identities delivered there. Refused,
// rebuilt from the window start, never before L.
TEST(RecoveryPlan, SnapshotBehindRetentionIsRefused) {
  auto in = inputs();
  in.snapshot = snapshot_at(100);
  in.committed = 500;
  in.low_watermark = 300;
  in.window_start_offset = 320;
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->filter, Source::kEmpty);
  EXPECT_EQ(plan->snapshot_refusal, SnapshotRefusal::kBehindRetention);
  EXPECT_EQ(plan->reason, RecoveryReason::kRebuildFromWindow);
  EXPECT_EQ(plan->fetch_from, 320);
  EXPECT_EQ(plan->rebuild_until, 500);
  EXPECT_FALSE(plan->window_past_retention);
  EXPECT_NE(plan->explanation.find("retention"), std::string::npos) << plan->explanation;
  EXPECT_STREQ(to_string(SnapshotRefusal::kBehindRetention), "behind_retention");

  // The window reaches back past retention: start at L and say so.
  in.window_start_offset = 300;
  plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->fetch_from, 300);
  EXPECT_TRUE(plan->window_past_retention);
  EXPECT_NE(plan->explanation.find("oldest stored offset 300"), std::string::npos)
      << plan->explanation;

  // S == C below L: nothing the snapshot lacks can be replayed by anyone;
  // the snapshot is still the best state there is.
  in.snapshot = snapshot_at(200);
  in.committed = 200;
  plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->filter, Source::kRestored);

  // S >= L: restored as usual.
  in.snapshot = snapshot_at(350);
  in.committed = 500;
  plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->filter, Source::kRestored);
  EXPECT_EQ(plan->fetch_from, 350);
}

TEST(RecoveryPlan, CommittedBelowRetentionStartsAtTheOldestRecord) {
  auto in = inputs();
  in.snapshot = refused(SnapshotRefusal::kMissing);
  in.committed = 50;
  in.low_watermark = 80;
  auto plan = plan_recovery(in);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->reason, RecoveryReason::kNoHistory);
  EXPECT_EQ(plan->fetch_from, 80);
  EXPECT_EQ(plan->committed_until, 50);
}

TEST(RecoveryPlan, NeverStartsBeforeRetentionProperty) {
  for (std::int64_t s = 0; s < 20; s += 4) {
    for (std::int64_t c = 0; c < 20; c += 3) {
      for (std::int64_t low = 0; low < 20; low += 5) {
        for (std::int64_t w = -1; w < 20; w += 6) {
          auto in = inputs();
          in.snapshot = snapshot_at(s);
          in.committed = c;
          in.low_watermark = low;
          if (w >= 0) in.window_start_offset = w;
          auto plan = plan_recovery(in);
          ASSERT_TRUE(plan);
          if (plan->filter == Source::kRestored) {
            EXPECT_LE(s, c);
            EXPECT_TRUE(s >= low || s == c) << s << " " << c << " " << low;
          } else {
            ASSERT_TRUE(plan->fetch_from);
            EXPECT_GE(*plan->fetch_from, low);
          }
          EXPECT_EQ(plan->committed_until, c);
        }
      }
    }
  }
}

// The replay rule of a recovering partition. With a restored snapshot every
// record below C is decided again (the snapshot holds the state before
// them); rebuilt from the output, only those delivered are learned and the
// others only move the clock. In [C, rebuild_until) only the offsets found
// in the output are learned (with partitioning: key a record can be missing
// from the output while a later one of the same input partition is there).
TEST(ReplayRule, AfterASnapshotDecidesBelowTheCommitAndLearnsWhatWasEmitted) {
  using A = ReplayRule::Action;
  ReplayRule none;
  EXPECT_EQ(none.action(0), A::kProcess);
  EXPECT_EQ(none.end(), 0);

  // C = 100, H = 109; 103 and 107 went to an output partition that never
  // got them (the crash), so they must be emitted now.
  ReplayRule rule(ReplayRule::Below::kSnapshot, 100, 110,
                  {109, 100, 101, 102, 104, 105, 106, 108, 5, 200, 101});
  for (std::int64_t o = 0; o < 100; ++o) EXPECT_EQ(rule.action(o), A::kDecide) << o;
  for (std::int64_t o : {100, 101, 102, 104, 105, 106, 108, 109}) {
    EXPECT_EQ(rule.action(o), A::kLearn) << o;
  }
  EXPECT_EQ(rule.action(103), A::kProcess);
  EXPECT_EQ(rule.action(107), A::kProcess);
  EXPECT_EQ(rule.action(110), A::kProcess);
  EXPECT_EQ(rule.action(200), A::kProcess);  // outside [C, rebuild_until): ignored
  EXPECT_EQ(rule.end(), 110);
  EXPECT_EQ(rule.delivered(), 8u);  // 5 is below C: decided, not learned

  // rebuild_until below C (nothing emitted past C) is C.
  ReplayRule plain(ReplayRule::Below::kSnapshot, 30, 0, {});
  EXPECT_EQ(plain.end(), 30);
  EXPECT_EQ(plain.action(29), A::kDecide);
  EXPECT_EQ(plain.action(30), A::kProcess);
}

TEST(ReplayRule, RebuiltFromTheOutputLearnsOnlyWhatWasDelivered) {
  using A = ReplayRule::Action;
  // Window start 40, C = 60, H = 63: 41, 45 and 52 were delivered before C
  // (the rest were duplicates), 61 and 63 after it.
  ReplayRule rule(ReplayRule::Below::kDelivered, 60, 64, {63, 45, 41, 52, 61, 900});
  for (std::int64_t o = 40; o < 60; ++o) {
    EXPECT_EQ(rule.action(o), o == 41 || o == 45 || o == 52 ? A::kLearn : A::kSkip) << o;
  }
  EXPECT_EQ(rule.action(60), A::kProcess);
  EXPECT_EQ(rule.action(61), A::kLearn);
  EXPECT_EQ(rule.action(62), A::kProcess);
  EXPECT_EQ(rule.action(63), A::kLearn);
  EXPECT_EQ(rule.action(64), A::kProcess);
  EXPECT_EQ(rule.action(900), A::kProcess);
  EXPECT_EQ(rule.delivered(), 5u);

  // partitioning: input: one producer delivered 61 and 63 in order, so 60
  // and 62 were dropped by the previous owner: they stay dropped.
  ReplayRule ordered(ReplayRule::Below::kDelivered, 60, 64, {63, 45, 41, 52, 61}, true);
  EXPECT_EQ(ordered.action(59), A::kSkip);
  EXPECT_EQ(ordered.action(60), A::kDropped);
  EXPECT_EQ(ordered.action(61), A::kLearn);
  EXPECT_EQ(ordered.action(62), A::kDropped);
  EXPECT_EQ(ordered.action(63), A::kLearn);
  EXPECT_EQ(ordered.action(64), A::kProcess);
}

TEST(RecoveryPlan, RejectsImpossibleInputs) {
  auto in = inputs();
  in.window_ms = 0;
  auto plan = plan_recovery(in);
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().message.find("orders[3]"), std::string::npos);
  in = inputs();
  in.committed = -1001;  // RD_KAFKA_OFFSET_INVALID passed through by mistake
  plan = plan_recovery(in);
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().message.find("-1001"), std::string::npos);
  in = inputs();
  in.snapshot = snapshot_at(-2);
  EXPECT_FALSE(plan_recovery(in));
}

TEST(RecoveryPlan, RewindTarget) {
  EXPECT_EQ(rewind_target_ms(100'000, 60'000), 40'000);
  EXPECT_EQ(rewind_target_ms(10'000, 60'000), 0);
}

TEST(RecoveryPlan, OfferFromStoreResult) {
  state::LoadResult<state::Snapshot> ok = state::Snapshot{};
  ok->info.next_offset = 12;
  ok->info.clock_ms = 34;
  auto offer = offer_from(ok);
  ASSERT_TRUE(offer.snapshot);
  EXPECT_EQ(offer.snapshot->next_offset, 12);
  EXPECT_EQ(offer.snapshot->clock_ms, 34);

  state::LoadResult<state::Snapshot> bad =
      tl::unexpected(state::LoadError{state::LoadFailure::kConfigChanged, "salt changed"});
  offer = offer_from(bad);
  EXPECT_FALSE(offer.snapshot);
  EXPECT_EQ(offer.refusal, SnapshotRefusal::kConfigChanged);
  EXPECT_EQ(offer.message, "salt changed");
}

TEST(SnapshotGate, OnlyAtCommittedPositions) {
  SnapshotGate gate;
  const PartitionId p{"orders", 1};
  EXPECT_FALSE(gate.may_snapshot(p, 0)) << "nothing committed yet";
  gate.committed(p, 100);
  EXPECT_TRUE(gate.may_snapshot(p, 100));
  EXPECT_TRUE(gate.may_snapshot(p, 50));
  EXPECT_FALSE(gate.may_snapshot(p, 101));
  EXPECT_FALSE(gate.may_snapshot({"orders", 2}, 10));
  gate.committed(p, 90);  // late callback of an older commit
  EXPECT_EQ(gate.committed_offset(p), 100);
  gate.committed(p, 200);
  EXPECT_TRUE(gate.may_snapshot(p, 150));
  gate.forget(p);
  EXPECT_FALSE(gate.committed_offset(p));
  EXPECT_FALSE(gate.may_snapshot(p, 150));
  EXPECT_EQ(gate.refused(), 4u);
}

TEST(SnapshotGate, ConcurrentCommitsAndQueries) {
  SnapshotGate gate;
  const PartitionId p{"t", 0};
  std::thread committer([&] {
    for (int i = 1; i <= 10'000; ++i) gate.committed(p, i);
  });
  std::int64_t last = 0;
  for (int i = 0; i < 10'000; ++i) {
    auto c = gate.committed_offset(p).value_or(0);
    EXPECT_GE(c, last) << "committed offsets never move back";
    last = c;
  }
  committer.join();
  EXPECT_TRUE(gate.may_snapshot(p, 10'000));
}

TEST(Provenance, ParsesValidHeaders) {
  auto r = parse_provenance({"orders", "7", "12345"});
  ASSERT_TRUE(r.provenance);
  EXPECT_FALSE(r.malformed);
  EXPECT_EQ(r.provenance->source, (PartitionId{"orders", 7}));
  EXPECT_EQ(r.provenance->offset, 12345);
}

TEST(Provenance, NoHeadersIsNotKdedupOutput) {
  auto r = parse_provenance({});
  EXPECT_FALSE(r.provenance);
  EXPECT_FALSE(r.malformed);
}

TEST(Provenance, MalformedValuesNameTheHeader) {
  struct Case {
    ProvenanceHeaders h;
    const char* header;
  };
  const Case cases[] = {
      {{"t", "1", std::nullopt}, "kdedup-source-offset"},
      {{std::nullopt, "1", "2"}, "kdedup-source-topic"},
      {{"t", std::nullopt, "2"}, "kdedup-source-partition"},
      {{"", "1", "2"}, "kdedup-source-topic"},
      {{"t", "x", "2"}, "kdedup-source-partition"},
      {{"t", "-1", "2"}, "kdedup-source-partition"},
      {{"t", "3000000000", "2"}, "kdedup-source-partition"},
      {{"t", "1", "-5"}, "kdedup-source-offset"},
      {{"t", "1", "+5"}, "kdedup-source-offset"},
      {{"t", "1", " 5"}, "kdedup-source-offset"},
      {{"t", "1", "5 "}, "kdedup-source-offset"},
      {{"t", "1", ""}, "kdedup-source-offset"},
      {{"t", "1", "99999999999999999999"}, "kdedup-source-offset"},
  };
  for (const auto& c : cases) {
    auto r = parse_provenance(c.h);
    EXPECT_FALSE(r.provenance);
    ASSERT_TRUE(r.malformed);
    EXPECT_NE(r.malformed->find(c.header), std::string::npos) << *r.malformed;
  }
}

TEST(Provenance, OutputPartitionsToRead) {
  using P = config::Partitioning;
  EXPECT_EQ(output_partitions_to_read(P::kInput, 2, 4), (std::vector<std::int32_t>{2}));
  EXPECT_TRUE(output_partitions_to_read(P::kInput, 4, 4).empty());
  EXPECT_EQ(output_partitions_to_read(P::kKey, 2, 3), (std::vector<std::int32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace kdedup::pipeline
