// The SM a block runs on and the device's %globaltimer (nanoseconds), read the same way by the
// harness's kernels (kernels.cu) and the cluster probe (clusters.cu).
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t sm_id() {
    uint32_t s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
