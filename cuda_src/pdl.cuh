// Programmatic dependent launch (sm_90+).  Inside a captured decode graph our kernels are
// launched with the programmatic-serialization attribute (pocketcupy/backend/pdl.py), so a
// kernel's blocks may start while the kernel before it in the stream is still running.
//
// Every kernel calls pdl_wait() before it reads anything another kernel writes, before its
// first global write and before any early return (a grid that finishes without waiting would
// let the kernel after it overtake the one before).  Reads of constant data (weights) may come
// first: prefetch_l2 pulls a GEMV block's first weights into L2 while the previous kernel drains.
// pdl_wait then lets the next kernel launch, so at most one kernel waits ahead.  Without the
// attribute, or before sm_90, both instructions are skipped and launches serialise as usual.
#pragma once

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ void prefetch_l2_line(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// The first blockDim.x 128-byte lines of [p, p + bytes) into L2, a line per thread.
__device__ __forceinline__ void prefetch_l2(const void* p, long long bytes) {
    const long long o = (long long)threadIdx.x * 128;
    if (o < bytes) prefetch_l2_line((const char*)p + o);
}
