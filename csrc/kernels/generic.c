/* generic.c — portable C kernels: the reference every ISA variant is checked against. */
#include "llmrt/llmrt.h"

void llmrt_register_kernels_generic(llmrt_kernel_table *kt) {
    (void)kt;
}
