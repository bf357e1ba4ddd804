#include "page_allocator.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace sched {

PageAllocator::PageAllocator(int32_t num_pages)
    : num_pages_(num_pages),
      refcount_(num_pages, 0),
      cached_(num_pages, 0),
      lru_prev_(num_pages, 0),
      lru_next_(num_pages, 0) {
  if (num_pages < 2) throw std::invalid_argument("num_pages must be >= 2 (page 0 is reserved)");
  free_.reserve(num_pages - 1);
  // Highest first, so allocate() hands out 1, 2, 3, ... on a fresh allocator.
  for (int32_t p = num_pages - 1; p >= 1; --p) free_.push_back(p);
}

PageAllocator::~PageAllocator() {
  int32_t leaked = 0;
  for (int32_t p = 1; p < num_pages_; ++p) leaked += refcount_[p] > 0;
  if (leaked == 0) return;
  std::fprintf(stderr, "scheduler: PageAllocator destroyed with %d page(s) still referenced\n",
               leaked);
#ifdef SCHEDULER_ABORT_ON_LEAK
  std::abort();
#endif
}

int32_t PageAllocator::allocate() {
  int32_t page = 0;
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
  } else if (num_lru_ > 0) {
    page = lru_next_[0];  // least recently released
    lru_unlink(page);
    cached_[page] = 0;
    ++evictions_;
    if (on_evict_) on_evict_(page);
  } else {
    return 0;
  }
  refcount_[page] = 1;
  return page;
}

void PageAllocator::retain(int32_t page) {
  if (page <= 0 || page >= num_pages_) throw std::logic_error("retain: bad page id");
  if (refcount_[page] == 0) {
    // Only a cached page can be revived from refcount 0; a free page must go via allocate().
    if (!cached_[page]) throw std::logic_error("retain of a free page " + std::to_string(page));
    lru_unlink(page);
  }
  ++refcount_[page];
}

void PageAllocator::release(int32_t page) {
  if (page <= 0 || page >= num_pages_ || refcount_[page] <= 0)
    throw std::logic_error("release of an unreferenced page " + std::to_string(page));
  if (--refcount_[page] > 0) return;
  if (cached_[page]) {
    lru_push_back(page);
  } else {
    free_.push_back(page);
  }
}

void PageAllocator::set_cached(int32_t page, bool cached) {
  if (cached_[page] == static_cast<uint8_t>(cached)) return;
  if (cached) {
    if (refcount_[page] == 0) throw std::logic_error("only a used page can enter the cache");
    cached_[page] = 1;
    return;
  }
  cached_[page] = 0;
  if (refcount_[page] == 0) {
    lru_unlink(page);
    free_.push_back(page);
  }
}

std::vector<int32_t> PageAllocator::lru_pages() const {
  std::vector<int32_t> out;
  for (int32_t p = lru_next_[0]; p != 0; p = lru_next_[p]) out.push_back(p);
  return out;
}

void PageAllocator::lru_push_back(int32_t page) {
  int32_t last = lru_prev_[0];
  lru_prev_[page] = last;
  lru_next_[page] = 0;
  lru_next_[last] = page;
  lru_prev_[0] = page;
  ++num_lru_;
}

void PageAllocator::lru_unlink(int32_t page) {
  lru_next_[lru_prev_[page]] = lru_next_[page];
  lru_prev_[lru_next_[page]] = lru_prev_[page];
  lru_prev_[page] = lru_next_[page] = 0;
  --num_lru_;
}

PageList::PageList(PageList&& other) noexcept
    : alloc_(other.alloc_), pages_(std::move(other.pages_)) {
  other.pages_.clear();
}

PageList& PageList::operator=(PageList&& other) noexcept {
  if (this != &other) {
    reset();
    alloc_ = other.alloc_;
    pages_ = std::move(other.pages_);
    other.pages_.clear();
  }
  return *this;
}

bool PageList::grow(int32_t n) {
  if (n <= 0) return true;
  if (alloc_->available() < n) return false;
  for (int32_t i = 0; i < n; ++i) pages_.push_back(alloc_->allocate());
  return true;
}

void PageList::share(int32_t page) {
  alloc_->retain(page);
  pages_.push_back(page);
}

void PageList::reset() {
  // Tail first: the LRU then evicts a released prefix from its end, so the pages that start
  // the chain (the ones other prompts are most likely to share) are the last to go.
  for (auto it = pages_.rbegin(); it != pages_.rend(); ++it) alloc_->release(*it);
  pages_.clear();
}

}  // namespace sched
