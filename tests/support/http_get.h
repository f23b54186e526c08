#pragma once
// A minimal blocking HTTP/1.1 GET client for loopback servers in tests
// (kdedup's /metrics, /healthz, /readyz and Prometheus' HTTP API).

#include <string>

namespace kdedup::testing {

struct HttpResponse {
  int status = 0;  ///< 0 when the connection failed
  std::string body;
};

/// GET http://127.0.0.1:<port><target>; `target` must already be URL-encoded.
HttpResponse http_get(int port, const std::string& target);

/// Percent-encodes everything outside RFC 3986's unreserved set.
std::string url_encode(const std::string& s);

}  // namespace kdedup::testing
