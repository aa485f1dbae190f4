// Where thread-block clusters can go: which SMs share a GPC, and how many 2-block clusters find room
// while a kernel holds some SMs. A standalone program (clusters.py builds and runs it); it prints
// one JSON object and changes nothing on the GPU.
//
// - "max_active_clusters": cudaOccupancyMaxActiveClusters for cluster sizes 1 to 16, one block of
//   `probe_smem` bytes per SM (as cuBLAS's Hopper GEMMs hold): sum over GPCs of floor(SMs / size).
// - "gpc_clusters": one launch of as many 16-block clusters as fit at once, each block's SM and
//   cluster: the SMs of a cluster are in one GPC.
// - "held": for each count h, a kernel holding h SMs for 20 ms (one warp with all of an SM's shared
//   memory; launched plainly or with a cluster dimension of 1), then, 2 ms later, one block per SM (132 on an H100) that spins 5 ms, launched alone
//   (cluster 1) or in clusters of 2 like cuBLAS's GEMMs: each block's SM and start. Those that
//   start at once found room beside the hold; the rest waited for a probe block or the hold to end.
#include <cuda_runtime.h>

#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "device_clock.cuh"

#define CHECK(x)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                      \
        }                                                                                      \
    } while (0)

__device__ __forceinline__ unsigned cluster_linear_id() {
    unsigned x, y, z, nx, ny;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(x));
    asm volatile("mov.u32 %0, %%clusterid.y;" : "=r"(y));
    asm volatile("mov.u32 %0, %%clusterid.z;" : "=r"(z));
    asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(nx));
    asm volatile("mov.u32 %0, %%nclusterid.y;" : "=r"(ny));
    return x + nx * (y + ny * z);
}

// Each block records its SM, its cluster and when it started, then spins for spin_ns. A globaltimer
// that stops advancing ends the spin after a bounded number of reads instead of hanging the GPU.
extern "C" __global__ void probe(unsigned long long spin_ns, unsigned* sm, unsigned* cluster,
                                 unsigned long long* start) {
    extern __shared__ unsigned char pad[];
    unsigned long long t0 = global_ns();
    if (threadIdx.x == 0) {
        sm[blockIdx.x] = sm_id();
        cluster[blockIdx.x] = cluster_linear_id();
        start[blockIdx.x] = t0;
        pad[0] = 0;
    }
    for (unsigned long long i = 0; global_ns() - t0 < spin_ns && i < (1ull << 40); ++i) {
    }
}

// A launch of `blocks` 32-thread probe blocks in clusters of `cluster`, each with `smem` bytes of
// dynamic shared memory. Not copyable: the configuration points at its own attribute.
struct ClusterLaunch {
    cudaLaunchAttribute attr = {};
    cudaLaunchConfig_t cfg = {};

    ClusterLaunch(unsigned blocks, unsigned cluster, size_t smem, cudaStream_t s = nullptr) {
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = cluster;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(32);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
    }
    ClusterLaunch(const ClusterLaunch&) = delete;
    ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

static cudaError_t launch(unsigned blocks, unsigned cluster, size_t smem, cudaStream_t s, unsigned long long spin_ns,
                          unsigned* sm, unsigned* cl, unsigned long long* st) {
    ClusterLaunch l(blocks, cluster, smem, s);
    return cudaLaunchKernelEx(&l.cfg, probe, spin_ns, sm, cl, st);
}

static int max_clusters(unsigned cluster, size_t smem) {
    ClusterLaunch l(cluster * 64, cluster, smem);
    int n = -1;
    if (cudaOccupancyMaxActiveClusters(&n, probe, &l.cfg) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return n;
}

static void print_list(const char* name, const unsigned* v, unsigned n, bool last = false) {
    std::printf("\"%s\": [", name);
    for (unsigned i = 0; i < n; ++i) std::printf("%s%u", i ? ", " : "", v[i]);
    std::printf("]%s", last ? "" : ", ");
}

int main() {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    const unsigned sms = p.multiProcessorCount;
    const size_t hold_smem = p.sharedMemPerMultiprocessor - 1024 - 64;  // nothing with shared memory fits beside
    const size_t probe_smem = 200 * 1024;                             // one block per SM, as cuBLAS's GEMMs
    CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)hold_smem));
    CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const unsigned cap = 4 * sms;
    unsigned *sm, *cl, *hsm, *hcl;
    unsigned long long *st, *hst;
    CHECK(cudaMalloc(&sm, cap * 4));
    CHECK(cudaMalloc(&cl, cap * 4));
    CHECK(cudaMalloc(&st, cap * 8));
    CHECK(cudaMalloc(&hsm, cap * 4));
    CHECK(cudaMalloc(&hcl, cap * 4));
    CHECK(cudaMalloc(&hst, cap * 8));
    std::vector<unsigned> vsm(cap), vcl(cap), vhsm(cap);
    std::vector<unsigned long long> vst(cap);
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));

    std::printf("{\"gpu\": \"%s\", \"sm_count\": %u, \"probe_smem_bytes\": %zu, \"hold_smem_bytes\": %zu, ", p.name, sms,
                probe_smem, hold_smem);
    std::printf("\"max_active_clusters\": {");
    for (unsigned c = 1; c <= 16; ++c) std::printf("%s\"%u\": %d", c > 1 ? ", " : "", c, max_clusters(c, probe_smem));
    std::printf("}, ");

    // As many 16-block clusters as fit at once: every block starts before any ends.
    int n16 = max_clusters(16, probe_smem);
    if (n16 > 0) {
        CHECK(launch(16 * n16, 16, probe_smem, a, 2000000ull, sm, cl, st));
        CHECK(cudaStreamSynchronize(a));
        CHECK(cudaMemcpy(vsm.data(), sm, 16 * n16 * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(vcl.data(), cl, 16 * n16 * 4, cudaMemcpyDeviceToHost));
        std::printf("\"gpc_clusters\": {");
        print_list("sm", vsm.data(), 16 * n16);
        print_list("cluster", vcl.data(), 16 * n16, true);
        std::printf("}, ");
    }

    const unsigned held_counts[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 66};
    const unsigned long long hold_ns = 20000000ull, probe_ns = 5000000ull;
    std::printf("\"held\": [");
    bool first = true;
    for (unsigned h : held_counts) {
        for (unsigned variant = 0; variant < 4; ++variant) {
            // The hold launched plainly (<<<>>>, as the harness's smloss part launches it) or with a
            // cluster dimension of 1 (cudaLaunchKernelEx): the block scheduler places them apart.
            const bool plain = variant >= 2;
            const unsigned cluster = 1 + variant % 2;
            if (plain)
                probe<<<h, 32, hold_smem, a>>>(hold_ns, hsm, hcl, hst);
            else
                CHECK(launch(h, 1, hold_smem, a, hold_ns, hsm, hcl, hst));
            CHECK(cudaGetLastError());
            // Let the holding blocks become resident before the probe arrives.
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, nullptr);
            CHECK(launch(sms, cluster, probe_smem, b, probe_ns, sm, cl, st));
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(vsm.data(), sm, sms * 4, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(vst.data(), st, sms * 8, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(vhsm.data(), hsm, h * 4, cudaMemcpyDeviceToHost));
            std::vector<unsigned long long> hstart(h);
            CHECK(cudaMemcpy(hstart.data(), hst, h * 8, cudaMemcpyDeviceToHost));
            unsigned long long t0 = hstart[0];
            for (unsigned i = 0; i < h; ++i) t0 = hstart[i] < t0 ? hstart[i] : t0;
            // Each probe block's start, in microseconds after the first holding block's.
            std::vector<unsigned> start_us(sms);
            for (unsigned i = 0; i < sms; ++i) start_us[i] = vst[i] > t0 ? (unsigned)((vst[i] - t0) / 1000) : 0;
            std::printf("%s{\"held_sms\": %u, \"cluster\": %u, \"hold_launch\": \"%s\", \"hold_us\": %llu, "
                        "\"probe_us\": %llu, ", first ? "" : ", ", h, cluster, plain ? "plain" : "cluster 1",
                        hold_ns / 1000, probe_ns / 1000);
            first = false;
            print_list("held_on", vhsm.data(), h);
            print_list("probe_sm", vsm.data(), sms);
            print_list("probe_start_us", start_us.data(), sms, true);
            std::printf("}");
        }
    }
    std::printf("]}\n");
    return 0;
}
