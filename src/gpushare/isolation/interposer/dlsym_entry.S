/*
 * dlsym, exported by libgpushare-cuda.so. A C wrapper would make every dlsym call look
 * as if it came from this library, and glibc resolves RTLD_NEXT relative to the caller's
 * return address: a wrapped RTLD_NEXT would find the wrong definition. So the entry asks
 * gs_dlsym_hook(handle, name) for a hook and, when there is none, restores the
 * arguments and jumps (not calls) to the real dlsym: glibc sees the original caller.
 */
#if defined(__x86_64__)
    .text
    .hidden gs_dlsym_hook
    .hidden gs_real_dlsym
    .globl dlsym
    .type dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp               /* the call below needs a 16-byte aligned stack */
    .cfi_adjust_cfa_offset 8
    call gs_dlsym_hook
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rax, %rax
    jz 1f
    ret
1:
    jmp *gs_real_dlsym(%rip)
    .cfi_endproc
    .size dlsym, .-dlsym
#else
#error "the dlsym entry is written for x86_64 only"
#endif
    .section .note.GNU-stack,"",@progbits
