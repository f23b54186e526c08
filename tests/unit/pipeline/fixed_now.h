// The fixed "now" (wall-clock ms) the pipeline unit tests run at.
#pragma once

#include <cstdint>

namespace kdedup::pipeline {

inline constexpr std::int64_t kWall = 1'700'000'000'000;

}  // namespace kdedup::pipeline
