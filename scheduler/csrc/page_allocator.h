// KV-cache pages: refcounted allocator and the RAII PageList that requests own.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace sched {

// Page 0 is the null page: it is never handed out, so the 0 that pads a page_table row can
// never alias a live page. It also serves as the sentinel of the intrusive LRU list.
//
// Every other page is in exactly one of three places:
//   free    refcount 0, not in the prefix cache         -> free_ stack
//   cached  refcount 0, registered in the prefix cache  -> LRU list (evictable)
//   used    refcount > 0 (it may also be registered)     -> owned by PageLists
// allocate() takes a free page first and only then evicts the least recently released cached
// page, so cached prefixes survive as long as there is room.
class PageAllocator {
 public:
  using EvictFn = std::function<void(int32_t page)>;

  explicit PageAllocator(int32_t num_pages);
  ~PageAllocator();  // leak check: every page must be free or cached by now
  PageAllocator(const PageAllocator&) = delete;
  PageAllocator& operator=(const PageAllocator&) = delete;

  int32_t num_pages() const { return num_pages_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_evictable() const { return num_lru_; }
  int32_t available() const { return num_free() + num_evictable(); }
  int32_t num_used() const { return num_pages_ - 1 - available(); }
  int32_t refcount(int32_t page) const { return refcount_[page]; }
  bool is_cached(int32_t page) const { return cached_[page] != 0; }
  int64_t evictions() const { return evictions_; }

  // One page with refcount 1, or 0 when nothing is free or evictable.
  int32_t allocate();
  void retain(int32_t page);
  void release(int32_t page);
  // Prefix-cache membership. Only a used page may be registered; unregistering a page with
  // refcount 0 moves it from the LRU list to the free stack.
  void set_cached(int32_t page, bool cached);
  // Called when allocate() evicts a cached page, so the prefix cache can drop its entry.
  void set_evict_callback(EvictFn fn) { on_evict_ = std::move(fn); }

  // For invariant checks: pages on the free stack and on the LRU list (oldest first).
  const std::vector<int32_t>& free_pages() const { return free_; }
  std::vector<int32_t> lru_pages() const;

 private:
  void lru_push_back(int32_t page);
  void lru_unlink(int32_t page);

  int32_t num_pages_;
  std::vector<int32_t> refcount_;
  std::vector<uint8_t> cached_;
  std::vector<int32_t> free_;
  std::vector<int32_t> lru_prev_, lru_next_;  // intrusive list; index 0 is the sentinel
  int32_t num_lru_ = 0;
  int64_t evictions_ = 0;
  EvictFn on_evict_;
};

// The pages a request holds, in logical order (page_table row). Move-only; the destructor
// returns every reference to the allocator, so a state that is dropped cannot leak pages.
class PageList {
 public:
  PageList() = default;
  explicit PageList(PageAllocator* alloc) : alloc_(alloc) {}
  PageList(PageList&& other) noexcept;
  PageList& operator=(PageList&& other) noexcept;
  PageList(const PageList&) = delete;
  PageList& operator=(const PageList&) = delete;
  ~PageList() { reset(); }

  // Appends n fresh pages, all or nothing.
  bool grow(int32_t n);
  // Appends a page that is already in use elsewhere (a prefix-cache hit): one more reference.
  void share(int32_t page);
  void reset();

  const std::vector<int32_t>& pages() const { return pages_; }
  int32_t size() const { return static_cast<int32_t>(pages_.size()); }

 private:
  PageAllocator* alloc_ = nullptr;
  std::vector<int32_t> pages_;
};

}  // namespace sched
