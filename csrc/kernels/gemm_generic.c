/*
 * gemm_generic.c — packed weights: the per-type layouts (pack_rows, pack_group_bytes, pack; the
 * same at every ISA level), the portable gemm kernels, and llmrt_pack_weight, which packs a whole
 * weight tensor at load. gemm.h states the contract.
 */
#include "llmrt/gemm.h"

#include <stdlib.h>
#include <string.h>

int llmrt_pack_weight(int type, const void *src, size_t src_row_bytes, int64_t K, int64_t M,
                      llmrt_packed *out) {
    memset(out, 0, sizeof(*out));
    const llmrt_kernel_table *kt = llmrt_kernels();
    const llmrt_type_traits *tt = llmrt_type_traits_get(type);
    if (tt == NULL || kt->pack_rows[type] <= 0 || kt->pack[type] == NULL) return LLMRT_EUNSUPPORTED;
    if (K <= 0 || M <= 0 || K % tt->blck_size != 0 || src == NULL) return LLMRT_EINVAL;
    const int R = kt->pack_rows[type];
    const size_t gb = kt->pack_group_bytes[type](K);
    const int64_t n_groups = (M + R - 1) / R;
    void *data = NULL;
    if (gb == 0 || gb % 64 != 0 || posix_memalign(&data, 64, gb * (size_t)n_groups) != 0) return LLMRT_ENOMEM;
    for (int64_t g = 0; g < n_groups; g++) {
        const int64_t m0 = g * R;
        const int rows = (int)(M - m0 < R ? M - m0 : R);
        kt->pack[type]((const char *)src + (size_t)m0 * src_row_bytes, src_row_bytes, K, rows,
                       (char *)data + (size_t)g * gb);
    }
    out->type = type;
    out->R = R;
    out->K = K;
    out->M = M;
    out->n_groups = n_groups;
    out->group_bytes = gb;
    out->data = data;
    return LLMRT_OK;
}

void llmrt_packed_free(llmrt_packed *p) {
    if (p == NULL) return;
    free(p->data);
    memset(p, 0, sizeof(*p));
}

void llmrt_register_gemm_kernels_generic(llmrt_kernel_table *kt) {
    (void)kt;
}
