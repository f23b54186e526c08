#pragma once
// Freed memory back to the system, whichever allocator the binary runs on.

namespace kdedup::pipeline {

/// Hands the pages of freed memory back to the system now (parked filters):
/// jemalloc's purge of every arena where the binary runs on jemalloc (its
/// background thread would, by its decay clock), else glibc's
/// malloc_trim(). glibc's malloc_trim() must not run under jemalloc: it
/// initialises glibc's unused allocator from a worker thread, whose exit
/// then trips glibc's arena accounting (an abort).
void return_freed_memory() noexcept;

}  // namespace kdedup::pipeline
