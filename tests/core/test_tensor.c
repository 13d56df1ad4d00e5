/* Tests of the dtype table (DH_DTYPE_MAP) and the tensor helpers of tensor.h. */
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/tensor.h"

static void dtype_table_gives_sizes_names_and_formats(void **state)
{
    assert_int_equal(dh_dtype_size(DH_DTYPE_UINT8), 1);
    assert_int_equal(dh_dtype_size(DH_DTYPE_BFLOAT16), 2);
    assert_int_equal(dh_dtype_size(DH_DTYPE_FLOAT32), 4);
    assert_int_equal(dh_dtype_size(DH_DTYPE_INT64), 8);
    assert_string_equal(dh_dtype_name(DH_DTYPE_FLOAT32), "float32");
    assert_string_equal(dh_dtype_name(DH_DTYPE_BOOL), "bool");
    assert_int_equal(dh_dtype_format(DH_DTYPE_UINT8), 'B');
    assert_int_equal(dh_dtype_format(DH_DTYPE_FLOAT64), 'd');
    assert_int_equal(dh_dtype_format(DH_DTYPE_BFLOAT16), 0); /* no buffer format */
    uint8_t code = 0, bits = 0;
    assert_int_equal(dh_dtype_dlpack(DH_DTYPE_FLOAT16, &code, &bits), 1);
    assert_int_equal(code, 2); /* kDLFloat */
    assert_int_equal(bits, 16);
    assert_int_equal(dh_dtype_dlpack(DH_DTYPE_INT32, &code, &bits), 1);
    assert_int_equal(code, 0); /* kDLInt */
    assert_int_equal(bits, 32);
}

/* The codes are the wire's: they must never move (docs/wire-protocol.md). */
static void dtype_codes_are_the_wire_codes(void **state)
{
    assert_int_equal(DH_DTYPE_UINT8, 1);
    assert_int_equal(DH_DTYPE_INT64, 8);
    assert_int_equal(DH_DTYPE_BFLOAT16, 10);
    assert_int_equal(DH_DTYPE_FLOAT32, 11);
    assert_int_equal(DH_DTYPE_BOOL, 13);
    /* every entry: size x 8 = DLPack bits */
#define XX(name, code, str, size, dl_code, dl_bits, fmt) assert_int_equal((size)*8, dl_bits);
    DH_DTYPE_MAP(XX)
#undef XX
}

static void unknown_dtypes_have_no_size(void **state)
{
    uint8_t code = 7, bits = 7;
    assert_int_equal(dh_dtype_size(0), 0);
    assert_int_equal(dh_dtype_size(14), 0);
    assert_int_equal(dh_dtype_size(255), 0);
    assert_string_equal(dh_dtype_name(99), "dtype?");
    assert_int_equal(dh_dtype_format(99), 0);
    assert_int_equal(dh_dtype_dlpack(0, &code, &bits), 0);
    assert_int_equal(code, 7); /* untouched */
}

/* dh_dtype_from_name is dh_dtype_name's inverse over the table, and -1 off it. */
static void dtype_names_look_up_their_codes(void **state)
{
#define XX(name, code, str, size, dl_code, dl_bits, fmt)                                           \
    assert_int_equal(dh_dtype_from_name(str), code);                                               \
    assert_int_equal(dh_dtype_from_name(dh_dtype_name(code)), code);
    DH_DTYPE_MAP(XX)
#undef XX
    assert_int_equal(dh_dtype_from_name("float32"), DH_DTYPE_FLOAT32);
    assert_int_equal(dh_dtype_from_name("dtype?"), -1);
    assert_int_equal(dh_dtype_from_name("Float32"), -1);
    assert_int_equal(dh_dtype_from_name("float"), -1);
    assert_int_equal(dh_dtype_from_name(""), -1);
    assert_int_equal(dh_dtype_from_name(NULL), -1);
}

static void contiguous_strides_count_elements(void **state)
{
    dh_tensor_t t = {.dtype = DH_DTYPE_FLOAT32, .ndim = 3, .shape = {2, 3, 5}};
    dh_tensor_set_contiguous(&t);
    assert_int_equal(t.strides[0], 15);
    assert_int_equal(t.strides[1], 5);
    assert_int_equal(t.strides[2], 1);
    assert_int_equal(t.nbytes, 2 * 3 * 5 * 4);
    t.shape[1] = 0;
    dh_tensor_set_contiguous(&t);
    assert_int_equal(t.nbytes, 0);
}

static void names_are_truncated_and_clear_frees(void **state)
{
    dh_tensor_t t = {0};
    dh_tensor_set_name(&t, "frames");
    assert_string_equal(t.name, "frames");
    char longer[64];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    dh_tensor_set_name(&t, longer);
    assert_int_equal(strlen(t.name), DH_TENSOR_NAME_MAX - 1);
    t.data = dh_malloc(16);
    t.nbytes = 16;
    dh_tensor_clear(&t); /* ASan: no leak */
    assert_null(t.data);
    assert_int_equal(t.nbytes, 0);
    assert_string_equal(t.name, "");
    dh_tensor_clear(&t);
    dh_tensor_clear(NULL);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(dtype_table_gives_sizes_names_and_formats),
    cmocka_unit_test(dtype_codes_are_the_wire_codes),
    cmocka_unit_test(unknown_dtypes_have_no_size),
    cmocka_unit_test(dtype_names_look_up_their_codes),
    cmocka_unit_test(contiguous_strides_count_elements),
    cmocka_unit_test(names_are_truncated_and_clear_frees),
};
DH_TEST_MAIN(tests)
