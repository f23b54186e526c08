#include "kdedup/metrics/stats_json.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kdedup::metrics {
namespace {

// A consumer's statistics document shaped like librdkafka 2.0's
// STATISTICS.md: top-level counters, one broker, two topics (one partition
// each plus the internal UA partition -1), and the consumer group.
constexpr const char* kConsumerStats = R"json({
  "name": "rdkafka#consumer-1", "client_id": "kdedup", "type": "consumer",
  "ts": 5016483227792, "time": 1700000000, "age": 5000123, "replyq": 0,
  "msg_cnt": 0, "msg_size": 0, "msg_max": 100000, "msg_size_max": 1073741824,
  "simple_cnt": 0, "metadata_cache_cnt": 2,
  "brokers": {
    "localhost:9092/1": {
      "name": "localhost:9092/1", "nodeid": 1, "nodename": "localhost:9092",
      "source": "configured", "state": "UP", "stateage": 4999000,
      "outbuf_cnt": 0, "outbuf_msg_cnt": 0, "waitresp_cnt": 1, "waitresp_msg_cnt": 0,
      "tx": 120, "txbytes": 9800, "txerrs": 0, "txretries": 0, "txidle": 1200,
      "req_timeouts": 0, "rx": 119, "rxbytes": 1203400, "rxerrs": 0,
      "rxcorriderrs": 0, "rxpartial": 0, "rxidle": 800, "zbuf_grow": 0,
      "buf_grow": 0, "wakeups": 240, "connects": 1, "disconnects": 0,
      "int_latency": {"min": 2, "max": 80, "avg": 10, "sum": 1000, "stddev": 4,
                      "p50": 9, "p75": 12, "p90": 20, "p95": 30, "p99": 70,
                      "p99_99": 80, "outofrange": 0, "hdrsize": 11376, "cnt": 100},
      "rtt": {"min": 150, "max": 900, "avg": 300, "sum": 36000, "stddev": 60,
              "p50": 280, "p75": 320, "p90": 400, "p95": 500, "p99": 800,
              "p99_99": 900, "outofrange": 0, "hdrsize": 13424, "cnt": 120},
      "req": {"Fetch": 100, "OffsetCommit": 5, "Heartbeat": 10},
      "toppars": {"orders-0": {"topic": "orders", "partition": 0}}
    }
  },
  "topics": {
    "orders": {
      "topic": "orders", "age": 4990000, "metadata_age": 4000,
      "batchsize": {"min": 0, "max": 0, "avg": 0, "sum": 0, "cnt": 0},
      "batchcnt": {"min": 0, "max": 0, "avg": 0, "sum": 0, "cnt": 0},
      "partitions": {
        "0": {"partition": 0, "broker": 1, "leader": 1, "desired": true,
              "unknown": false, "msgq_cnt": 0, "msgq_bytes": 0, "xmit_msgq_cnt": 0,
              "xmit_msgq_bytes": 0, "fetchq_cnt": 52, "fetchq_size": 53248,
              "fetch_state": "active", "query_offset": -1001, "next_offset": 10452,
              "app_offset": 10400, "stored_offset": 10400, "stored_leader_epoch": -1,
              "committed_offset": 10100, "committed_leader_epoch": -1,
              "eof_offset": -1001, "lo_offset": 0, "hi_offset": 10520,
              "ls_offset": 10520, "consumer_lag": 420, "consumer_lag_stored": 120,
              "leader_epoch": -1, "txmsgs": 0, "txbytes": 0, "rxmsgs": 10452,
              "rxbytes": 10702848, "msgs": 10452, "rx_ver_drops": 0,
              "msgs_inflight": 0, "next_ack_seq": 0, "next_err_seq": 0,
              "acked_msgid": 0},
        "-1": {"partition": -1, "broker": -1, "leader": -1, "desired": false,
               "unknown": false, "msgq_cnt": 0, "msgq_bytes": 0,
               "fetch_state": "none", "committed_offset": -1001,
               "consumer_lag": -1, "consumer_lag_stored": -1}
      }
    },
    "payments": {
      "topic": "payments", "age": 4990000, "metadata_age": 4000,
      "partitions": {
        "3": {"partition": 3, "broker": 1, "leader": 1, "desired": true,
              "fetch_state": "active", "committed_offset": 77, "hi_offset": 84,
              "ls_offset": 84, "consumer_lag": 7, "consumer_lag_stored": 7},
        "4": {"partition": 4, "broker": 1, "leader": 1, "desired": false,
              "fetch_state": "none", "committed_offset": -1001, "hi_offset": 90,
              "consumer_lag": -1, "consumer_lag_stored": -1}
      }
    }
  },
  "cgrp": {"state": "up", "stateage": 4000, "join_state": "steady",
           "rebalance_age": 3900, "rebalance_cnt": 2,
           "rebalance_reason": "group rejoin", "assignment_size": 2},
  "tx": 120, "tx_bytes": 9800, "rx": 119, "rx_bytes": 1203400,
  "txmsgs": 0, "txmsg_bytes": 0, "rxmsgs": 10459, "rxmsg_bytes": 10710016
})json";

constexpr const char* kProducerStats = R"json({
  "name": "rdkafka#producer-2", "client_id": "kdedup", "type": "producer",
  "ts": 5016483230001, "time": 1700000000, "age": 5000100, "replyq": 3,
  "msg_cnt": 37, "msg_size": 18432, "msg_max": 100000, "msg_size_max": 1073741824,
  "brokers": {}, "topics": {
    "orders-dedup": {"topic": "orders-dedup", "partitions": {
      "0": {"partition": 0, "msgq_cnt": 30, "consumer_lag": -1}}}},
  "tx": 44, "txmsgs": 10100, "txmsg_bytes": 5120000, "rx": 44
})json";

const PartitionLag* find(const ClientStatistics& s, std::string_view topic, int partition) {
  auto it = std::find_if(s.lags.begin(), s.lags.end(), [&](const PartitionLag& l) {
    return l.topic == topic && l.partition == partition;
  });
  return it == s.lags.end() ? nullptr : &*it;
}

TEST(StatsJson, ConsumerDocument) {
  auto stats = parse_statistics(kConsumerStats);
  ASSERT_TRUE(stats) << stats.error().message;
  EXPECT_EQ(stats->name, "rdkafka#consumer-1");
  EXPECT_EQ(stats->type, "consumer");
  EXPECT_EQ(stats->ts_us, 5016483227792);
  EXPECT_EQ(stats->rebalance_cnt, 2);
  EXPECT_EQ(stats->assignment_size, 2);
  // The UA partition and partitions with unknown lag are left out.
  ASSERT_EQ(stats->lags.size(), 2u);
  ASSERT_NE(find(*stats, "orders", 0), nullptr);
  EXPECT_EQ(find(*stats, "orders", 0)->consumer_lag, 420);
  ASSERT_NE(find(*stats, "payments", 3), nullptr);
  EXPECT_EQ(find(*stats, "payments", 3)->consumer_lag, 7);
  EXPECT_EQ(find(*stats, "orders", -1), nullptr);
  EXPECT_EQ(find(*stats, "payments", 4), nullptr);
  // Fetched (next_offset 10452) and not yet taken (app_offset 10400).
  EXPECT_EQ(find(*stats, "orders", 0)->unread, 52);
  EXPECT_EQ(find(*stats, "payments", 3)->unread, 0);  // no offsets in the document
}

TEST(StatsJson, UnreadRecordsOfAPartitionWithoutALag) {
  // Nothing committed yet (lag unknown), records fetched: the partition is
  // kept for its unread records; logical offsets (-1001) are unknown.
  auto stats = parse_statistics(R"json({"name": "c", "type": "consumer", "topics": {
    "orders": {"partitions": {
      "0": {"partition": 0, "consumer_lag": -1, "next_offset": 700, "app_offset": 200},
      "1": {"partition": 1, "consumer_lag": -1, "next_offset": 700, "app_offset": -1001},
      "2": {"partition": 2, "consumer_lag": 5, "next_offset": 90, "app_offset": 90}}}}})json");
  ASSERT_TRUE(stats) << stats.error().message;
  ASSERT_EQ(stats->lags.size(), 2u);
  ASSERT_NE(find(*stats, "orders", 0), nullptr);
  EXPECT_EQ(find(*stats, "orders", 0)->consumer_lag, -1);
  EXPECT_EQ(find(*stats, "orders", 0)->unread, 500);
  EXPECT_EQ(find(*stats, "orders", 1), nullptr);
  EXPECT_EQ(find(*stats, "orders", 2)->unread, 0);
}

TEST(StatsJson, ProducerDocument) {
  auto stats = parse_statistics(kProducerStats);
  ASSERT_TRUE(stats) << stats.error().message;
  EXPECT_EQ(stats->type, "producer");
  EXPECT_EQ(stats->msg_cnt, 37);
  EXPECT_EQ(stats->msg_size, 18432);
  EXPECT_EQ(stats->rebalance_cnt, -1);  // producers have no cgrp
  EXPECT_TRUE(stats->lags.empty());
}

TEST(StatsJson, MalformedJsonIsAnError) {
  const std::string doc = kConsumerStats;
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, doc.size() / 3, doc.size() - 2}) {
    auto stats = parse_statistics(std::string_view(doc).substr(0, cut));
    ASSERT_FALSE(stats) << "cut at " << cut;
    EXPECT_NE(stats.error().message.find("librdkafka statistics"), std::string::npos);
  }
  auto garbage = parse_statistics("{\"topics\": {\"a\": \xff\xfe}}");
  EXPECT_FALSE(garbage);
}

TEST(StatsJson, NonObjectDocumentIsAnError) {
  auto stats = parse_statistics("[1, 2, 3]");
  ASSERT_FALSE(stats);
  EXPECT_NE(stats.error().message.find("not a JSON object"), std::string::npos);
}

TEST(StatsJson, WrongFieldTypesNameTheField) {
  auto lag = parse_statistics(
      R"({"type": "consumer", "topics": {"orders": {"partitions":
         {"0": {"partition": 0, "consumer_lag": "12"}}}}})");
  ASSERT_FALSE(lag);
  EXPECT_NE(lag.error().message.find("topics.orders.partitions.0.consumer_lag"), std::string::npos)
      << lag.error().message;

  auto topics = parse_statistics(R"({"type": "consumer", "topics": []})");
  ASSERT_FALSE(topics);
  EXPECT_NE(topics.error().message.find("'topics'"), std::string::npos);

  auto msg_cnt = parse_statistics(R"({"type": "producer", "msg_cnt": 1.5})");
  ASSERT_FALSE(msg_cnt);
  EXPECT_NE(msg_cnt.error().message.find("msg_cnt"), std::string::npos);

  auto type = parse_statistics(R"({"type": 7})");
  ASSERT_FALSE(type);
  EXPECT_NE(type.error().message.find("type"), std::string::npos);
}

TEST(StatsJson, MissingSectionsAreFine) {
  auto stats = parse_statistics(R"({"name": "x", "type": "consumer"})");
  ASSERT_TRUE(stats) << stats.error().message;
  EXPECT_TRUE(stats->lags.empty());
  EXPECT_EQ(stats->msg_cnt, 0);
}

}  // namespace
}  // namespace kdedup::metrics
