#include "kdedup/metrics/server.h"

#include <gtest/gtest.h>

#include <thread>

#include "exercise.h"
#include "http_get.h"

namespace kdedup::metrics {
namespace {

using kdedup::testing::http_get;

std::unique_ptr<Metrics> make(std::chrono::milliseconds heartbeat_timeout) {
  MetricsOptions options;
  options.heartbeat_timeout = heartbeat_timeout;
  auto m = Metrics::create(options);
  EXPECT_TRUE(m);
  return std::move(*m);
}

TEST(MetricsServer, ServesMetricsOnAnEphemeralLoopbackPort) {
  auto m = make(std::chrono::seconds(30));
  auto handles = kdedup::testing::exercise_every_metric(*m);
  auto server = MetricsServer::start("127.0.0.1:0", *m);
  ASSERT_TRUE(server) << server.error().message;
  ASSERT_GT((*server)->port(), 0);
  const auto r = http_get((*server)->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("kdedup_build_info{"), std::string::npos);
  EXPECT_NE(r.body.find("kdedup_records_in_total{partition=\"0\",topic=\"orders\"} 4000"),
            std::string::npos);
  EXPECT_EQ(http_get((*server)->port(), "/nothing-here").status, 404);
}

TEST(MetricsServer, HealthzFollowsTheHeartbeat) {
  auto m = make(std::chrono::milliseconds(150));
  auto server = MetricsServer::start("127.0.0.1:0", *m);
  ASSERT_TRUE(server) << server.error().message;
  const int port = (*server)->port();
  auto r = http_get(port, "/healthz");
  EXPECT_EQ(r.status, 200);  // construction counts as a beat
  EXPECT_EQ(r.body, "ok\n");

  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  r = http_get(port, "/healthz");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("main loop stalled: last heartbeat"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("limit 0.150 s"), std::string::npos) << r.body;

  m->health().beat();
  r = http_get(port, "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
}

TEST(MetricsServer, ReadyzFollowsThePipeline) {
  auto m = make(std::chrono::seconds(30));
  auto server = MetricsServer::start("127.0.0.1:0", *m);
  ASSERT_TRUE(server) << server.error().message;
  const int port = (*server)->port();
  auto r = http_get(port, "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not ready: starting\n");

  m->health().set_not_ready("restoring 2 of 4 partitions");
  r = http_get(port, "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not ready: restoring 2 of 4 partitions\n");

  m->health().set_ready();
  r = http_get(port, "/readyz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ready\n");
  EXPECT_NE(http_get(port, "/metrics").body.find("kdedup_ready 1"), std::string::npos);

  m->health().set_not_ready("rebalance in progress");
  EXPECT_EQ(http_get(port, "/readyz").status, 503);
}

TEST(MetricsServer, BadAddressesAreClearErrors) {
  auto m = make(std::chrono::seconds(30));
  for (const char* bad : {"9464", "localhost:", "127.0.0.1:http", "127.0.0.1:70000", "::1:9464"}) {
    auto s = MetricsServer::start(bad, *m);
    ASSERT_FALSE(s) << bad;
    EXPECT_NE(s.error().message.find(std::string("'") + bad + "'"), std::string::npos)
        << s.error().message;
  }
}

TEST(MetricsServer, PortInUseIsAnError) {
  auto m = make(std::chrono::seconds(30));
  auto first = MetricsServer::start("127.0.0.1:0", *m);
  ASSERT_TRUE(first) << first.error().message;
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsServer::start(address, *m);
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("cannot listen"), std::string::npos)
      << second.error().message;
}

}  // namespace
}  // namespace kdedup::metrics
