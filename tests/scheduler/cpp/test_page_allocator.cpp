#include <algorithm>
#include <set>

#include "harness.h"
#include "page_allocator.h"

using sched::PageAllocator;
using sched::PageList;

TEST(null_page_is_never_handed_out) {
  PageAllocator alloc(5);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i) got.insert(alloc.allocate());
  CHECK(got == std::set<int32_t>({1, 2, 3, 4}));
  CHECK(alloc.allocate() == 0);  // exhausted
  CHECK(alloc.num_used() == 4 && alloc.available() == 0);
  for (int32_t p : got) alloc.release(p);
  CHECK(alloc.num_free() == 4);
}

TEST(rejects_too_few_pages) { CHECK_THROWS(PageAllocator(1), std::invalid_argument, "num_pages"); }

TEST(refcount_shared_page) {
  PageAllocator alloc(4);
  int32_t p = alloc.allocate();
  alloc.retain(p);
  CHECK(alloc.refcount(p) == 2);
  alloc.release(p);
  CHECK(alloc.refcount(p) == 1 && alloc.num_free() == 2);
  alloc.release(p);
  CHECK(alloc.refcount(p) == 0 && alloc.num_free() == 3);
  CHECK_THROWS(alloc.release(p), std::logic_error, "unreferenced");
  CHECK_THROWS(alloc.retain(p), std::logic_error, "free page");
}

TEST(cached_pages_are_evicted_lru_only_when_nothing_is_free) {
  PageAllocator alloc(4);  // pages 1..3
  std::vector<int32_t> evicted;
  alloc.set_evict_callback([&](int32_t p) { evicted.push_back(p); });
  int32_t a = alloc.allocate(), b = alloc.allocate(), c = alloc.allocate();
  alloc.set_cached(a, true);
  alloc.set_cached(b, true);
  alloc.release(b);  // b released first: least recently used
  alloc.release(a);
  CHECK(alloc.num_evictable() == 2 && alloc.num_free() == 0 && alloc.available() == 2);
  alloc.release(c);  // not cached: goes to the free stack and is taken before any eviction
  CHECK(alloc.allocate() == c && evicted.empty());
  CHECK(alloc.allocate() == b && evicted == std::vector<int32_t>({b}));
  CHECK(!alloc.is_cached(b) && alloc.evictions() == 1);
  alloc.retain(a);  // a cache hit revives a from the LRU list
  CHECK(alloc.num_evictable() == 0 && alloc.allocate() == 0);
  alloc.release(a);
  alloc.set_cached(a, false);  // dropping an unreferenced cached page frees it
  CHECK(alloc.num_free() == 1 && alloc.num_evictable() == 0);
  alloc.release(b);
  alloc.release(c);
}

TEST(page_list_raii_and_move) {
  PageAllocator alloc(6);
  {
    PageList pages(&alloc);
    CHECK(pages.grow(3) && pages.size() == 3);
    CHECK(!pages.grow(3));  // all or nothing
    CHECK(pages.size() == 3 && alloc.num_free() == 2);
    PageList moved = std::move(pages);
    CHECK(pages.size() == 0 && moved.size() == 3);  // NOLINT(bugprone-use-after-move)
    PageList other(&alloc);
    other.share(moved.pages()[0]);
    CHECK(alloc.refcount(moved.pages()[0]) == 2);
    other = std::move(moved);  // other's old reference is returned first
    CHECK(alloc.refcount(other.pages()[0]) == 1 && alloc.num_used() == 3);
  }
  CHECK(alloc.num_used() == 0 && alloc.num_free() == 5);
}

TEST(page_list_releases_tail_first) {
  PageAllocator alloc(5);
  PageList pages(&alloc);
  CHECK(pages.grow(3));
  std::vector<int32_t> ids = pages.pages();
  for (int32_t p : ids) alloc.set_cached(p, true);
  pages.reset();
  std::vector<int32_t> lru = alloc.lru_pages();
  std::reverse(ids.begin(), ids.end());
  CHECK(lru == ids);  // the chain's last page is evicted first, its first page last
}

HARNESS_MAIN
