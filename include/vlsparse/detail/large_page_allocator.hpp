// vlsparse/detail/large_page_allocator.hpp -- the allocator of KvCache's K/V rows (not for users).
//
// Blocks of at least 2 MiB are aligned to 2 MiB and, on Linux, advised for transparent huge pages
// (madvise MADV_HUGEPAGE) before they are first touched. Decode over a subset of the rows (A-VL's
// core list, ZipVL's kept tokens) reads short rows scattered over the whole cache: with 4 KiB pages
// nearly every listed row is on a page of its own, and its address translation costs as much as the
// row. With 2 MiB pages one translation covers thousands of rows. Where the kernel refuses (THP set
// to "never") the advice is ignored and the memory is ordinary. Smaller blocks use operator new.
// Stateless; every instance compares equal. Include: internal (kv/kv_cache.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace vlsparse::detail {

inline constexpr std::size_t kLargePage = std::size_t{2} << 20;

template <class T>
struct LargePageAllocator {
    using value_type = T;

    LargePageAllocator() noexcept = default;
    template <class U>
    LargePageAllocator(const LargePageAllocator<U>&) noexcept {}

    [[nodiscard]] T* allocate(std::size_t n) {
        constexpr std::size_t limit =
            (static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) - kLargePage) / sizeof(T);
        if (n > limit) throw std::bad_array_new_length();
        const std::size_t bytes = n * sizeof(T);
        if (bytes < kLargePage) return static_cast<T*>(::operator new(bytes, std::align_val_t{alignof(T)}));
        const std::size_t rounded = (bytes + kLargePage - 1) / kLargePage * kLargePage;
        void* p = std::aligned_alloc(kLargePage, rounded);
        if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
#endif
        return static_cast<T*>(p);
    }

    void deallocate(T* p, std::size_t n) noexcept {
        if (n * sizeof(T) < kLargePage)
            ::operator delete(p, std::align_val_t{alignof(T)});
        else
            std::free(p);
    }

    template <class U>
    bool operator==(const LargePageAllocator<U>&) const noexcept {
        return true;
    }
};

}  // namespace vlsparse::detail
