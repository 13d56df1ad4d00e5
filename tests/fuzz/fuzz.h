/* fuzz.h: what the libFuzzer targets of tests/fuzz share (docs/testing.md, "Fuzzing").
 *
 * Each fuzz_<parser>.c is one libFuzzer target: LLVMFuzzerTestOneInput hands it one input,
 * it runs the parser on it, checks what the parser promises about an accepted input (a
 * round trip, ranges, borrowed strings in bounds), and frees everything, so AddressSanitizer
 * (leaks included) and UndefinedBehaviorSanitizer see every path. A broken promise is a
 * crash: FUZZ_CHECK prints the condition and the library's last error message, and aborts;
 * libFuzzer saves the input.
 */
#ifndef DH_TESTS_FUZZ_H
#define DH_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "datahelix/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: fuzz check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, dh_last_error());                                                       \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
