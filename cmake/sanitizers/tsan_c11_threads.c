// C11 threads through pthreads, for ThreadSanitizer builds only
// (KDEDUP_SANITIZE=thread links this into every executable).
//
// Why: librdkafka creates its threads with C11 thrd_create() and locks with
// mtx_* / cnd_* / call_once. glibc implements those by calling its pthread
// internals directly, so the sanitizer's pthread interceptors (GCC 12's
// libtsan and LLVM 14's alike have none for C11 threads) never see them: a
// librdkafka thread is unknown to ThreadSanitizer and crashes on its first
// allocation, and librdkafka's locks would order nothing. Defined in the
// executable, these take precedence over glibc's for librdkafka (an
// unversioned definition in the executable matches its versioned
// references) and call the intercepted pthread functions, which is what
// glibc does minus the interception. glibc's mtx_t, cnd_t and once_flag
// have the layouts of pthread_mutex_t, pthread_cond_t and pthread_once_t.

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

static int thrd_result(int err) {
  switch (err) {
    case 0:
      return thrd_success;
    case EBUSY:
      return thrd_busy;
    case ETIMEDOUT:
      return thrd_timedout;
    case ENOMEM:
      return thrd_nomem;
    default:
      return thrd_error;
  }
}

struct start {
  thrd_start_t func;
  void* arg;
};

static void* run_c11_thread(void* p) {
  struct start s = *(struct start*)p;
  free(p);
  return (void*)(intptr_t)s.func(s.arg);
}

int thrd_create(thrd_t* thr, thrd_start_t func, void* arg) {
  struct start* s = malloc(sizeof *s);
  if (s == NULL) return thrd_nomem;
  s->func = func;
  s->arg = arg;
  const int err = pthread_create((pthread_t*)thr, NULL, run_c11_thread, s);
  if (err != 0) free(s);
  return thrd_result(err);
}

int thrd_join(thrd_t thr, int* res) {
  void* value = NULL;
  const int err = pthread_join((pthread_t)thr, &value);
  if (err == 0 && res != NULL) *res = (int)(intptr_t)value;
  return thrd_result(err);
}

int thrd_detach(thrd_t thr) { return thrd_result(pthread_detach((pthread_t)thr)); }

int mtx_init(mtx_t* m, int type) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  if (type & mtx_recursive) pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  const int err = pthread_mutex_init((pthread_mutex_t*)m, &attr);
  pthread_mutexattr_destroy(&attr);
  return thrd_result(err);
}

int mtx_lock(mtx_t* m) { return thrd_result(pthread_mutex_lock((pthread_mutex_t*)m)); }

int mtx_trylock(mtx_t* m) { return thrd_result(pthread_mutex_trylock((pthread_mutex_t*)m)); }

int mtx_timedlock(mtx_t* restrict m, const struct timespec* restrict ts) {
  return thrd_result(pthread_mutex_timedlock((pthread_mutex_t*)m, ts));
}

int mtx_unlock(mtx_t* m) { return thrd_result(pthread_mutex_unlock((pthread_mutex_t*)m)); }

void mtx_destroy(mtx_t* m) { pthread_mutex_destroy((pthread_mutex_t*)m); }

int cnd_init(cnd_t* c) { return thrd_result(pthread_cond_init((pthread_cond_t*)c, NULL)); }

int cnd_signal(cnd_t* c) { return thrd_result(pthread_cond_signal((pthread_cond_t*)c)); }

int cnd_broadcast(cnd_t* c) { return thrd_result(pthread_cond_broadcast((pthread_cond_t*)c)); }

int cnd_wait(cnd_t* c, mtx_t* m) {
  return thrd_result(pthread_cond_wait((pthread_cond_t*)c, (pthread_mutex_t*)m));
}

int cnd_timedwait(cnd_t* restrict c, mtx_t* restrict m, const struct timespec* restrict ts) {
  return thrd_result(pthread_cond_timedwait((pthread_cond_t*)c, (pthread_mutex_t*)m, ts));
}

void cnd_destroy(cnd_t* c) { pthread_cond_destroy((pthread_cond_t*)c); }

void call_once(once_flag* flag, void (*func)(void)) { pthread_once((pthread_once_t*)flag, func); }
