#include "free_memory.h"

#include <malloc.h>

#include <cstddef>

// jemalloc's control interface: weak, so null where the binary runs on
// glibc's allocator (the sanitizer builds, the tests' programs).
extern "C" int mallctl(const char* name, void* oldp, std::size_t* oldlenp, void* newp,
                       std::size_t newlen) __attribute__((weak));

namespace kdedup::pipeline {

void return_freed_memory() noexcept {
  if (mallctl != nullptr) {
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena (jemalloc 5: 4096).
    static_cast<void>(mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0));
    return;
  }
  malloc_trim(0);
}

}  // namespace kdedup::pipeline
