// jemalloc's options (the release binaries link jemalloc; this string is
// read when it starts, and MALLOC_CONF in the environment overrides it).
//
// background_thread: a thread of jemalloc's own hands freed pages back to
// the system on its decay schedule (dirty_decay_ms, 10 s) whether or not
// the process allocates meanwhile. Without it, jemalloc purges only as
// threads allocate and free, so what a burst freed stayed resident while the
// instance was quiet: 256 partitions 10 s after 2 M keys held 272-413 MiB
// RSS, 178-205 MiB with it, for the same CPU per record within the noise
// (docs/performance.md, "Freed memory leaves a quiet process").
//
// Unused where the binary runs on glibc's allocator (the sanitizer builds).
extern "C" {
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): jemalloc reads this name.
const char* malloc_conf = "background_thread:true";
}
