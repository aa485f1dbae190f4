// Kernels of the ovsim calibration harness (run.py compiles this file with nvcc to a cubin and
// launches it through CuPy on PyTorch's streams, so the profiler records these kernels beside
// cuBLAS's).
//
// Every kernel takes `rec`: when it is not null, thread 0 of each block writes three words for its
// block, the SM it ran on and its start and end on the device's %globaltimer (nanoseconds). Dispatch
// order, residency and per-block times are then read off the device rather than inferred.
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

#include "device_clock.cuh"

__device__ __forceinline__ void write_record(uint64_t* rec, uint64_t start_ns) {
    if (rec != nullptr && threadIdx.x == 0) {
        uint64_t* r = rec + 3ull * blockIdx.x;
        r[0] = sm_id();
        r[1] = start_ns;
        r[2] = global_ns();
    }
}

// ---- communication-like kernels --------------------------------------------------------------
// One block per channel, as NCCL runs one block per channel: a channel moves its contiguous slice
// of the buffer `iters` times, in 16-byte words, staged through shared memory with a block barrier
// (each word is written to shared memory by one warp and stored to global memory by another), so
// the kernel holds NCCL's footprint (512-640 threads, ~80 KB dynamic shared memory set at launch)
// and its traffic pattern (copy: one read and one write per byte; reduce: two reads and a write).
#define CHANNEL_UNROLL 4

union Word {
    uint4 u;
    __half2 h[4];
};

__device__ __forceinline__ uint4 add_half8(uint4 a, uint4 b) {
    Word x, y, z;
    x.u = a;
    y.u = b;
#pragma unroll
    for (int i = 0; i < 4; ++i) z.h[i] = __hadd2(x.h[i], y.h[i]);
    return z.u;
}

// NCCL's kernels allocate 96 registers per thread; these loops need about 32. Values kept live
// across the loop (an empty asm that claims to change them) make the allocation NCCL's, so the
// kernel leaves an SM the same room for other blocks.
#define CHANNEL_HELD_REGISTERS 60

template <bool REDUCE>
__device__ __forceinline__ void channel_body(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                             uint4* __restrict__ dst, long long n_words, int iters,
                                             uint64_t* rec) {
    extern __shared__ uint4 stage[];
    const uint64_t t0 = global_ns();
    const long long per = (n_words + gridDim.x - 1) / gridDim.x;
    const long long lo = per * blockIdx.x;
    const long long hi = lo + per < n_words ? lo + per : n_words;
    const int nt = blockDim.x;
    const int tid = threadIdx.x;
    // The thread one warp over (block sizes are whole warps: 512, 544 or 640 threads).
    const int partner = tid + 32 < nt ? tid + 32 : tid + 32 - nt;
    uint32_t held[CHANNEL_HELD_REGISTERS];
#pragma unroll
    for (int r = 0; r < CHANNEL_HELD_REGISTERS; ++r) held[r] = tid * (r + 1);
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int r = 0; r < CHANNEL_HELD_REGISTERS; ++r) asm volatile("" : "+r"(held[r]));
        for (long long base = lo; base < hi; base += (long long)nt * CHANNEL_UNROLL) {
#pragma unroll
            for (int u = 0; u < CHANNEL_UNROLL; ++u) {
                const long long i = base + (long long)u * nt + tid;
                if (i < hi) {
                    uint4 v = a[i];
                    if (REDUCE) v = add_half8(v, b[i]);
                    stage[u * nt + tid] = v;
                }
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < CHANNEL_UNROLL; ++u) {
                const long long i = base + (long long)u * nt + partner;
                if (i < hi) dst[i] = stage[u * nt + partner];
            }
            __syncthreads();
        }
    }
    uint32_t sum = 0;
#pragma unroll
    for (int r = 0; r < CHANNEL_HELD_REGISTERS; ++r) sum += held[r];
    // Never true (the sum is tid times a constant below 2^31 for tid < 1024): keeps `held` alive.
    if (sum == 0xFFFFFFFFu && hi < 0) dst[0] = make_uint4(sum, 0, 0, 0);
    write_record(rec, t0);
}

extern "C" __global__ void __launch_bounds__(640) ovsim_channel_copy(const uint4* __restrict__ src,
                                                                     uint4* __restrict__ dst, long long n_words,
                                                                     int iters, uint64_t* rec) {
    channel_body<false>(src, nullptr, dst, n_words, iters, rec);
}

extern "C" __global__ void __launch_bounds__(640) ovsim_channel_reduce(const uint4* __restrict__ a,
                                                                       const uint4* __restrict__ b,
                                                                       uint4* __restrict__ dst, long long n_words,
                                                                       int iters, uint64_t* rec) {
    channel_body<true>(a, b, dst, n_words, iters, rec);
}

// A channel that only waits, as an NCCL channel waits for its peer: every thread polls a flag word
// of its block's own 4 KB line set with volatile loads (L2 hits, as LL/LL128 flag polling is) until
// spin_ns of the global timer have passed, holding the channel's footprint (launch bounds, dynamic
// shared memory) all the while. `flags` holds gridDim.x * 1024 words; nothing ever writes them.
extern "C" __global__ void __launch_bounds__(640) ovsim_channel_poll(const volatile uint32_t* flags,
                                                                     uint64_t spin_ns, uint64_t* rec) {
    const uint64_t t0 = global_ns();
    const volatile uint32_t* line = flags + 1024ull * blockIdx.x;
    uint32_t seen = 0;
    const long long c0 = clock64();
    // The SM clock bounds the wait too, as in spin_body: a stalled timer cannot hang the GPU.
    while (global_ns() - t0 < spin_ns && clock64() - c0 < 16ll * (long long)spin_ns) {
        seen += line[threadIdx.x % 1024];
    }
    if (seen == 0xFFFFFFFFu && spin_ns == 0) ((uint32_t*)flags)[0] = seen;  // never: keeps the loads
    write_record(rec, t0);
}

// ---- dispatch probes ---------------------------------------------------------------------------
// Blocks that hold their SM for a set time and do nothing else; the launch sets threads and dynamic
// shared memory, which set how many fit on an SM. With `stagger`, block i holds it for
// spin_ns * (1 + (i % 4) / 4), so the blocks sharing an SM retire one at a time and an SM empties
// only if the scheduler stops refilling it. Two names so a trace tells an experiment's kernels apart.
__device__ __forceinline__ void spin_body(uint64_t spin_ns, int stagger, uint64_t* rec) {
    __shared__ uint64_t start;
    if (threadIdx.x == 0) start = global_ns();
    __syncthreads();
    const uint64_t t0 = start;
    const uint64_t hold = spin_ns + (stagger ? (blockIdx.x % 4) * (spin_ns / 4) : 0);
    // The SM clock bounds the wait too (16 cycles per nanosecond held: never reached below 16 GHz),
    // so a %globaltimer that does not advance ends the probe instead of hanging the GPU.
    const long long c0 = clock64();
    while (global_ns() - t0 < hold && clock64() - c0 < 16ll * (long long)hold) {
    }
    __syncthreads();
    write_record(rec, t0);
}

extern "C" __global__ void ovsim_probe_first(uint64_t spin_ns, int stagger, uint64_t* rec) {
    spin_body(spin_ns, stagger, rec);
}

extern "C" __global__ void ovsim_probe_second(uint64_t spin_ns, int stagger, uint64_t* rec) {
    spin_body(spin_ns, stagger, rec);
}

// ---- clock probe ---------------------------------------------------------------------------------
// One thread reads its SM's cycle counter and the global timer, spins on the timer for window_ns and
// reads both again: the SM clock over the window, as the SM counted it (NVML's clock reading is a
// sample the driver reports, not a count). Launched between the kernels of one stream, it gives the
// clock they ran at. Writes four words at out + 4 * slot: SM, start and end (ns), cycles elapsed.
extern "C" __global__ void ovsim_clock_probe(uint64_t window_ns, int slot, uint64_t* out) {
    if (threadIdx.x != 0) return;
    const uint64_t t0 = global_ns();
    const long long c0 = clock64();
    uint64_t t1 = t0;
    long long c1 = c0;
    while (t1 - t0 < window_ns) {
        c1 = clock64();
        t1 = global_ns();
    }
    uint64_t* r = out + 4ull * slot;
    r[0] = sm_id();
    r[1] = t0;
    r[2] = t1;
    r[3] = (uint64_t)(c1 - c0);
}

// ---- GEMM with shapeable occupancy ---------------------------------------------------------------
// C (fp32, M x N) = A (fp16, M x K, row-major) . B (fp16, K x N, row-major); one 64x64 output tile
// per block of 4 warps (32x32 each, 2x2 WMMA 16x16x16 fragments), K in steps of 32 through a
// two-stage cp.async pipeline: the 64x64x32 tiles of Cui & Pericas's study. Extra dynamic shared
// memory given at launch is allocated and never touched: it only lowers how many blocks fit on an
// SM (occupancy shaping). M and N must be multiples of 64, K of 32.
#define GT_M 64
#define GT_N 64
#define GT_K 32
#define GT_PAD 8

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

extern "C" __global__ void __launch_bounds__(128) ovsim_gemm_tile64(const __half* __restrict__ A,
                                                                    const __half* __restrict__ B,
                                                                    float* __restrict__ C, int M, int N, int K,
                                                                    uint64_t* rec) {
    using namespace nvcuda;
    __shared__ __align__(128) __half As[2][GT_M][GT_K + GT_PAD];
    __shared__ __align__(128) __half Bs[2][GT_K][GT_N + GT_PAD];
    const uint64_t t0 = global_ns();
    const int tiles_n = N / GT_N;
    const int row0 = (blockIdx.x / tiles_n) * GT_M;
    const int col0 = (blockIdx.x % tiles_n) * GT_N;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int wm = (warp / 2) * 32;
    const int wn = (warp % 2) * 32;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    // A tile: 64 rows x 32 halves = 4 chunks of 16 B per row; B tile: 32 rows x 64 halves = 8 per row.
    auto load = [&](int stage, int k0) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int idx = tid + c * 128;
            const int ar = idx / 4, ac = (idx % 4) * 8;
            cp_async16(&As[stage][ar][ac], A + (size_t)(row0 + ar) * K + k0 + ac);
            const int br = idx / 8, bc = (idx % 8) * 8;
            cp_async16(&Bs[stage][br][bc], B + (size_t)(k0 + br) * N + col0 + bc);
        }
        cp_async_commit();
    };

    const int steps = K / GT_K;
    load(0, 0);
    for (int s = 0; s < steps; ++s) {
        const int cur = s & 1;
        if (s + 1 < steps) {
            load(cur ^ 1, (s + 1) * GT_K);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GT_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &As[cur][wm + 16 * i][kk], GT_K + GT_PAD);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &Bs[cur][kk][wn + 16 * j], GT_N + GT_PAD);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        // The next load overwrites the stage just read.
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(C + (size_t)(row0 + wm + 16 * i) * N + col0 + wn + 16 * j, acc[i][j], N,
                                    wmma::mem_row_major);
    __syncthreads();
    write_record(rec, t0);
}

// ---- WMMA GEMMs of other tiles --------------------------------------------------------------------
// The same kernel as ovsim_gemm_tile64 (FP16 WMMA, 32-deep k-steps, two-stage cp.async pipeline),
// which stays as it was measured (its strided load loops compile to other code than its fixed
// two: the two 64x64 kernels ran within 1.5% of each other, calibration/data/h200-sxm/2026-11-29-d),
// for a BM x BN output tile shared by WARPS_M x WARPS_N warps: how a kernel of one's own runs as
// its tile grows (fewer L2 reads per FLOP, more accumulators per warp). M must be a multiple of BM,
// N of BN, K of 32.
template <int BM, int BN, int WARPS_M, int WARPS_N>
__device__ __forceinline__ void gemm_wmma_tile(const __half* __restrict__ A, const __half* __restrict__ B,
                                               float* __restrict__ C, int M, int N, int K, uint64_t* rec) {
    using namespace nvcuda;
    constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int FM = WTM / 16, FN = WTN / 16;
    constexpr int A_CHUNKS = BM * GT_K / 8, B_CHUNKS = GT_K * BN / 8;  // 16-byte chunks per stage
    __shared__ __align__(128) __half As[2][BM][GT_K + GT_PAD];
    __shared__ __align__(128) __half Bs[2][GT_K][BN + GT_PAD];
    const uint64_t t0 = global_ns();
    const int tiles_n = N / BN;
    const int row0 = (blockIdx.x / tiles_n) * BM;
    const int col0 = (blockIdx.x % tiles_n) * BN;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int wm = (warp / WARPS_N) * WTM;
    const int wn = (warp % WARPS_N) * WTN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    auto load = [&](int stage, int k0) {
#pragma unroll
        for (int idx = tid; idx < A_CHUNKS; idx += THREADS) {
            const int ar = idx / (GT_K / 8), ac = (idx % (GT_K / 8)) * 8;
            cp_async16(&As[stage][ar][ac], A + (size_t)(row0 + ar) * K + k0 + ac);
        }
#pragma unroll
        for (int idx = tid; idx < B_CHUNKS; idx += THREADS) {
            const int br = idx / (BN / 8), bc = (idx % (BN / 8)) * 8;
            cp_async16(&Bs[stage][br][bc], B + (size_t)(k0 + br) * N + col0 + bc);
        }
        cp_async_commit();
    };

    const int steps = K / GT_K;
    load(0, 0);
    for (int s = 0; s < steps; ++s) {
        const int cur = s & 1;
        if (s + 1 < steps) {
            load(cur ^ 1, (s + 1) * GT_K);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GT_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], &As[cur][wm + 16 * i][kk], GT_K + GT_PAD);
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], &Bs[cur][kk][wn + 16 * j], BN + GT_PAD);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
            wmma::store_matrix_sync(C + (size_t)(row0 + wm + 16 * i) * N + col0 + wn + 16 * j, acc[i][j], N,
                                    wmma::mem_row_major);
    __syncthreads();
    write_record(rec, t0);
}

// ovsim_gemm_wmma_<BM>x<BN>_w<warps>: one kernel per tile and warp layout.
#define OVSIM_GEMM_WMMA(BM, BN, WARPS_M, WARPS_N, WARPS)                                                    \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) ovsim_gemm_wmma_##BM##x##BN##_w##WARPS(       \
        const __half* __restrict__ A, const __half* __restrict__ B, float* __restrict__ C, int M, int N, int K, \
        uint64_t* rec) {                                                                                     \
        gemm_wmma_tile<BM, BN, WARPS_M, WARPS_N>(A, B, C, M, N, K, rec);                                     \
    }
OVSIM_GEMM_WMMA(64, 64, 2, 2, 4)
OVSIM_GEMM_WMMA(128, 64, 2, 2, 4)
OVSIM_GEMM_WMMA(64, 128, 2, 2, 4)
OVSIM_GEMM_WMMA(128, 128, 2, 2, 4)
OVSIM_GEMM_WMMA(128, 128, 2, 4, 8)
