// docs/metrics.md is the contract with operators, the dashboard and the
// alert rules: every exported metric must be listed there with its type, and
// nothing may be listed that is not exported.
#include <gtest/gtest.h>
#include <prometheus/metric_family.h>

#include <map>

#include "exercise.h"
#include "kdedup/metrics/metrics.h"
#include "metrics_doc.h"

namespace kdedup::metrics {
namespace {

// Rows of the reference tables: "| `kdedup_name` | type | labels | ... |".
std::map<std::string, std::string> documented_metrics() {
  const auto doc =
      kdedup::testing::read_metrics_doc(std::string(KDEDUP_SOURCE_DIR) + "/docs/metrics.md");
  for (const auto& problem : doc.problems) ADD_FAILURE() << "docs/metrics.md: " << problem;
  return doc.types;
}

std::string type_name(prometheus::MetricType t) {
  switch (t) {
    case prometheus::MetricType::Counter:
      return "counter";
    case prometheus::MetricType::Gauge:
      return "gauge";
    case prometheus::MetricType::Histogram:
      return "histogram";
    case prometheus::MetricType::Summary:
      return "summary";
    default:
      return "untyped";
  }
}

TEST(MetricsDocs, EveryExportedMetricIsDocumentedAndViceVersa) {
  auto m = Metrics::create(MetricsOptions{});
  ASSERT_TRUE(m);
  auto handles = testing::exercise_every_metric(**m);
  const auto families = (*m)->collect();
  const auto documented = documented_metrics();
  ASSERT_GT(documented.size(), 30u);

  std::map<std::string, std::string> exported;
  for (const auto& f : families) {
    exported[f.name] = type_name(f.type);
    EXPECT_FALSE(f.metric.empty()) << f.name << " has no series after exercising everything";
    EXPECT_FALSE(f.help.empty()) << f.name;
  }
  for (const auto& [name, type] : exported) {
    auto it = documented.find(name);
    if (it == documented.end()) {
      ADD_FAILURE() << name << " is exported but not documented in docs/metrics.md";
    } else {
      EXPECT_EQ(it->second, type) << name << ": docs/metrics.md says " << it->second;
    }
  }
  for (const auto& [name, type] : documented) {
    EXPECT_TRUE(exported.count(name))
        << name << " is documented in docs/metrics.md but not exported";
  }
}

}  // namespace
}  // namespace kdedup::metrics
