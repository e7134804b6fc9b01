/* types.c — the per-type traits table (one row per supported tensor type). */
#include "llmrt/llmrt.h"

static const llmrt_type_traits type_traits[LLMRT_TYPE_COUNT] = {
    [LLMRT_TYPE_F32]    = { "F32",    1,      sizeof(float),        0, LLMRT_TYPE_F32  },
    [LLMRT_TYPE_F16]    = { "F16",    1,      sizeof(llmrt_fp16_t), 0, LLMRT_TYPE_F16  },
    [LLMRT_TYPE_BF16]   = { "BF16",   1,      sizeof(llmrt_bf16_t), 0, LLMRT_TYPE_BF16 },
    [LLMRT_TYPE_Q4_0]   = { "Q4_0",   QK4_0,  sizeof(block_q4_0),   1, LLMRT_TYPE_Q8_0 },
    [LLMRT_TYPE_Q4_1]   = { "Q4_1",   QK4_1,  sizeof(block_q4_1),   1, LLMRT_TYPE_Q8_1 },
    [LLMRT_TYPE_Q5_0]   = { "Q5_0",   QK5_0,  sizeof(block_q5_0),   1, LLMRT_TYPE_Q8_0 },
    [LLMRT_TYPE_Q5_1]   = { "Q5_1",   QK5_1,  sizeof(block_q5_1),   1, LLMRT_TYPE_Q8_1 },
    [LLMRT_TYPE_Q8_0]   = { "Q8_0",   QK8_0,  sizeof(block_q8_0),   1, LLMRT_TYPE_Q8_0 },
    [LLMRT_TYPE_Q8_1]   = { "Q8_1",   QK8_1,  sizeof(block_q8_1),   1, LLMRT_TYPE_Q8_1 },
    [LLMRT_TYPE_Q2_K]   = { "Q2_K",   QK_K,   sizeof(block_q2_K),   1, LLMRT_TYPE_Q8_K },
    [LLMRT_TYPE_Q3_K]   = { "Q3_K",   QK_K,   sizeof(block_q3_K),   1, LLMRT_TYPE_Q8_K },
    [LLMRT_TYPE_Q4_K]   = { "Q4_K",   QK_K,   sizeof(block_q4_K),   1, LLMRT_TYPE_Q8_K },
    [LLMRT_TYPE_Q5_K]   = { "Q5_K",   QK_K,   sizeof(block_q5_K),   1, LLMRT_TYPE_Q8_K },
    [LLMRT_TYPE_Q6_K]   = { "Q6_K",   QK_K,   sizeof(block_q6_K),   1, LLMRT_TYPE_Q8_K },
    [LLMRT_TYPE_Q8_K]   = { "Q8_K",   QK_K,   sizeof(block_q8_K),   1, LLMRT_TYPE_Q8_K },
    [LLMRT_TYPE_IQ4_NL] = { "IQ4_NL", QK4_NL, sizeof(block_iq4_nl), 1, LLMRT_TYPE_Q8_0 },
    [LLMRT_TYPE_IQ4_XS] = { "IQ4_XS", QK_K,   sizeof(block_iq4_xs), 1, LLMRT_TYPE_Q8_K },
    /* llmrt-private weight-only types (never in a GGUF file; see llmrt.h) */
    [LLMRT_TYPE_WQ_Q8A]       = { "WQ_Q8A",       32, sizeof(block_q8a),  1, LLMRT_TYPE_Q8_1 },
    [LLMRT_TYPE_WQ_Q4_0_F32]  = { "WQ_Q4_0_F32",  32, sizeof(block_q4_0), 1, LLMRT_TYPE_F32  },
    [LLMRT_TYPE_WQ_Q4_1_F32]  = { "WQ_Q4_1_F32",  32, sizeof(block_q4_1), 1, LLMRT_TYPE_F32  },
    [LLMRT_TYPE_WQ_Q8_0_F32]  = { "WQ_Q8_0_F32",  32, sizeof(block_q8_0), 1, LLMRT_TYPE_F32  },
    [LLMRT_TYPE_WQ_Q8A_F32]   = { "WQ_Q8A_F32",   32, sizeof(block_q8a),  1, LLMRT_TYPE_F32  },
    [LLMRT_TYPE_WQ_Q4_0_BF16] = { "WQ_Q4_0_BF16", 32, sizeof(block_q4_0), 1, LLMRT_TYPE_BF16 },
    [LLMRT_TYPE_WQ_Q4_1_BF16] = { "WQ_Q4_1_BF16", 32, sizeof(block_q4_1), 1, LLMRT_TYPE_BF16 },
    [LLMRT_TYPE_WQ_Q8_0_BF16] = { "WQ_Q8_0_BF16", 32, sizeof(block_q8_0), 1, LLMRT_TYPE_BF16 },
    [LLMRT_TYPE_WQ_Q8A_BF16]  = { "WQ_Q8A_BF16",  32, sizeof(block_q8a),  1, LLMRT_TYPE_BF16 },
    [LLMRT_TYPE_I8]     = { "I8",     1,      1,                    0, -1 },
    [LLMRT_TYPE_I16]    = { "I16",    1,      2,                    0, -1 },
    [LLMRT_TYPE_I32]    = { "I32",    1,      4,                    0, -1 },
    [LLMRT_TYPE_I64]    = { "I64",    1,      8,                    0, -1 },
    [LLMRT_TYPE_F64]    = { "F64",    1,      8,                    0, -1 },
};

const llmrt_type_traits *llmrt_type_traits_get(int type) {
    if (type < 0 || type >= LLMRT_TYPE_COUNT || type_traits[type].name == NULL) return NULL;
    return &type_traits[type];
}

size_t llmrt_row_size(int type, int64_t ne) {
    const llmrt_type_traits *tt = llmrt_type_traits_get(type);
    if (tt == NULL || ne < 0 || ne % tt->blck_size != 0) return 0;
    return (size_t)(ne / tt->blck_size) * tt->type_size;
}
