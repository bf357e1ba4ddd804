// Leak detection is a hard error in test builds (SCHEDULER_ABORT_ON_LEAK): this program leaks
// a page reference on purpose and passes only if the allocator's destructor aborts.
#include <csignal>
#include <cstdio>
#include <unistd.h>

#include "page_allocator.h"

int main() {
  std::signal(SIGABRT, [](int) { _exit(0); });  // the abort we expect
  {
    sched::PageAllocator alloc(8);
    alloc.allocate();  // refcount 1, never released
  }
  std::fprintf(stderr, "leaked page was not detected\n");
  return 1;
}
