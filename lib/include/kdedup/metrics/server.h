#pragma once
// MetricsServer: the HTTP endpoint for /metrics, /healthz and /readyz on one
// port.
//
// prometheus-cpp 1.0's Exposer owns its CivetServer privately and can only
// serve registries, not custom paths, so kdedup runs civetweb's CivetServer
// itself and renders /metrics with prometheus-cpp's TextSerializer. Same
// wire format, one port, and probes keep answering while a scrape runs
// (two worker threads).
//
// Owned by the app; `metrics` must outlive it. Stopping happens in the
// destructor (joins civetweb's threads). Thread-safe.

#include <memory>
#include <string>
#include <string_view>

#include "kdedup/common/result.h"
#include "kdedup/metrics/metrics.h"

class CivetServer;

namespace kdedup::metrics {

class MetricsServer {
 public:
  /// Listens on `address` ("host:port", "[v6]:port"; port 0 picks a free
  /// one). Errors name the address and what went wrong.
  [[nodiscard]] static Result<std::unique_ptr<MetricsServer>> start(std::string_view address,
                                                                    Metrics& metrics);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// The port actually bound (useful with port 0).
  [[nodiscard]] int port() const noexcept { return port_; }

 private:
  struct Handlers;
  MetricsServer() = default;

  std::unique_ptr<Handlers> handlers_;   // must outlive server_
  std::unique_ptr<CivetServer> server_;  // destroyed first (stops threads)
  int port_ = 0;
  std::string wake_host_;  // where the destructor knocks to stop civetweb promptly
};

/// Splits "host:port" / "[v6]:port" and checks the port; exposed for tests.
[[nodiscard]] Status check_listen_address(std::string_view address);

}  // namespace kdedup::metrics
