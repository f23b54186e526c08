#include "kdedup/common/kafka_log.h"

#include <spdlog/spdlog.h>

namespace kdedup {

void log_librdkafka(std::string_view client, int severity, std::string_view facility,
                    std::string_view message) {
  const auto level = severity <= 3   ? spdlog::level::err
                     : severity == 4 ? spdlog::level::warn
                                     : spdlog::level::info;
  spdlog::log(level, "librdkafka {} {}: {}", client, facility, message);
}

}  // namespace kdedup
