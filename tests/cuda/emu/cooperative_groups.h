// emu/cooperative_groups.h — the emulator's stand-in for the part of cooperative groups the
// backend uses: a thread block cluster (k_gdn_step in src/backend/cuda/cuda_gdn.cuh). The blocks
// of a cluster run on threads of their own, in turn (cuda_runtime.h, run_launch): sync() is the
// cluster barrier (every thread of every block of the cluster), map_shared_rank() the same
// __shared__ variable in another block of the cluster (distributed shared memory).
#pragma once
#include "cuda_runtime.h"

namespace cooperative_groups {
struct cluster_group {
    unsigned block_rank() const { return cuemu::cluster ? cuemu::cluster_rank : 0; }
    unsigned num_blocks() const { return cuemu::cluster ? cuemu::cluster->n : 1; }
    void sync() const {
        __syncthreads();
        if (cuemu::cur == 0 && cuemu::cluster) cuemu::cluster_arrive();
        __syncthreads();
    }
    // p: a __shared__ variable of this block (a thread_local of this block's thread).
    template <typename T>
    T *map_shared_rank(T *p, unsigned r) const {
        if (!cuemu::cluster) return p;
        return (T *)(cuemu::cluster->anchor[r] + ((char *)p - &cuemu::tls_anchor));
    }
};
inline cluster_group this_cluster() { return {}; }
} // namespace cooperative_groups
