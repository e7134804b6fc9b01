/* dot_generic.c — portable dot-product kernels (weight type x activation type). */
#include "llmrt/llmrt.h"

void llmrt_register_dot_kernels_generic(llmrt_kernel_table *kt) {
    (void)kt;
}
