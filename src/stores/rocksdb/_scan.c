/*
 * rocksdb-scan: stream the keys and values of a RocksDB directory, opened read-only, to
 * standard output in Arrow's binary-array layout, for the Spark export.
 *
 * Usage: rocksdb-scan DIR FROM_HEX TO_HEX [BATCH_ROWS [BATCH_BYTES [GET_HEX]]]
 *   FROM_HEX: the first key of the range, hex ("" for the first key of the database);
 *   TO_HEX:   the key the range stops before, hex ("-" for no bound);
 *   GET_HEX:  a key read on its own before the range (the store's checkpoint), so that the
 *             database is opened (and its WAL replayed) once for both.
 *
 * Output, little-endian:
 *   the 8 bytes "GZRSCAN1" (this frame format's version: a reader refuses other versions);
 *   with GET_HEX, then: u32 found (0 or 1), u32 value bytes, the value;
 *   then a frame per batch: u32 rows, u32 key bytes, u32 value bytes,
 *     i32 key_offsets[rows + 1], key data, zero padding to a multiple of 8 bytes (from the
 *     frame's first offset: value offsets stay aligned for Arrow),
 *     i32 value_offsets[rows + 1], value data.
 * A frame of 0 rows ends a complete scan. On error a message goes to standard error and
 * the exit status is 1 (2 for bad arguments); no end frame is written, so a reader that
 * sees the stream end without it knows the scan is incomplete.
 *
 * Usage: rocksdb-scan --split DIR FROM_HEX TO_HEX COUNT
 *   Prints "GZRSPLIT1", then up to COUNT - 1 increasing keys (hex, a line each) that cut the
 *   keys of [FROM, TO) into COUNT ranges of about equal size on disk, as RocksDB estimates
 *   the size of a key range from its SST files' indexes (the memtable is not counted). Exit
 *   status 3: the database cannot be opened.
 *
 * Built by `python -m gazette.stores.rocksdb.scan build` against Debian's librocksdb, linked
 * statically: RocksDB's thread-local counters then cost a third less than through the
 * shared library. See docs/spark.md ("The native RocksDB scanner").
 */
#include <errno.h>
#include <rocksdb/c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rocksdb-scan writes its frames in the machine's byte order, which must be little-endian"
#endif

static int write_all(const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(STDOUT_FILENO, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "rocksdb-scan: writing the output: %s\n", strerror(errno));
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static const char MAGIC[8] = {'G', 'Z', 'R', 'S', 'C', 'A', 'N', '1'};

/* A growable byte buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + extra) cap *= 2;
    char *data = realloc(b->data, cap);
    if (data == NULL) {
        fprintf(stderr, "rocksdb-scan: out of memory (%zu bytes)\n", cap);
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_add(buf_t *b, const void *data, size_t len) {
    if (buf_reserve(b, len) != 0) return -1;
    if (len) memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes `hex` into `out` (malloc'd); returns its length, or -1 if `hex` is not hex. */
static long parse_hex(const char *hex, char **out) {
    size_t n = strlen(hex);
    if (n % 2) return -1;
    *out = malloc(n / 2 + 1);
    if (*out == NULL) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        (*out)[i] = (char)(hi * 16 + lo);
    }
    return (long)(n / 2);
}

typedef struct {
    buf_t key_offsets, keys, value_offsets, values;
    uint32_t rows;
} batch_t;

static int batch_reset(batch_t *b) {
    int32_t zero = 0;
    b->key_offsets.len = b->keys.len = b->value_offsets.len = b->values.len = 0;
    b->rows = 0;
    return buf_add(&b->key_offsets, &zero, 4) || buf_add(&b->value_offsets, &zero, 4) ? -1 : 0;
}

static int batch_flush(batch_t *b) {
    static const char zeros[8] = {0};
    uint32_t header[3] = {b->rows, (uint32_t)b->keys.len, (uint32_t)b->values.len};
    size_t pad = (8 - (b->key_offsets.len + b->keys.len) % 8) % 8;
    if (write_all(header, sizeof header) || write_all(b->key_offsets.data, b->key_offsets.len) ||
        write_all(b->keys.data, b->keys.len) || write_all(zeros, pad) ||
        write_all(b->value_offsets.data, b->value_offsets.len) ||
        write_all(b->values.data, b->values.len))
        return -1;
    return batch_reset(b);
}

/* The estimated bytes on disk of keys in [a, b). */
static uint64_t range_size(rocksdb_t *db, const char *a, size_t a_len, const char *b,
                           size_t b_len, char **err) {
    uint64_t size = 0;
    rocksdb_approximate_sizes(db, 1, &a, &a_len, &b, &b_len, &size, err);
    return size;
}

/* mid = (lo + hi) / 2, all `width`-byte big-endian numbers. */
static void midpoint(const unsigned char *lo, const unsigned char *hi, unsigned char *mid,
                     size_t width) {
    unsigned carry = 0;
    for (size_t i = width; i-- > 0;) {
        unsigned sum = (unsigned)lo[i] + hi[i] + carry;
        mid[i] = (unsigned char)sum;
        carry = sum >> 8;
    }
    for (size_t i = 0; i < width; i++) {
        unsigned next = (carry << 8) | mid[i];
        mid[i] = (unsigned char)(next >> 1);
        carry = next & 1;
    }
}

static int print_hex(const unsigned char *key, size_t len) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        if (putchar(digits[key[i] >> 4]) == EOF || putchar(digits[key[i] & 15]) == EOF) return -1;
    }
    return putchar('\n') == EOF ? -1 : 0;
}

/* `--split`: each point found by bisecting the keys between the range's first and last key
 * (read as big-endian numbers) on the estimated size of the keys below it. */
static int split_main(int argc, char **argv) {
    char *from = NULL, *to = NULL, *err = NULL;
    long from_len = argc == 5 ? parse_hex(argv[2], &from) : -1;
    long to_len = argc == 5 && strcmp(argv[3], "-") != 0 ? parse_hex(argv[3], &to) : 0;
    long count = argc == 5 ? atol(argv[4]) : 0;
    if (from_len < 0 || to_len < 0 || count < 1) {
        fprintf(stderr, "usage: rocksdb-scan --split DIR FROM_HEX TO_HEX COUNT\n");
        return 2;
    }
    if (printf("GZRSPLIT1\n") < 0) return 1;
    rocksdb_options_t *options = rocksdb_options_create();
    rocksdb_t *db = rocksdb_open_for_read_only(options, argv[1], 0, &err);
    if (err != NULL) {
        fprintf(stderr, "rocksdb-scan: opening %s: %s\n", argv[1], err);
        return 3;
    }
    rocksdb_readoptions_t *read = rocksdb_readoptions_create();
    if (to != NULL) rocksdb_readoptions_set_iterate_upper_bound(read, to, (size_t)to_len);
    rocksdb_iterator_t *it = rocksdb_create_iterator(db, read);
    unsigned char *first = NULL, *end = NULL, *lo = NULL, *hi = NULL, *mid = NULL;
    unsigned char *last_point = NULL;
    size_t first_len = 0, end_len = 0, last_point_len = 0, width = 0;
    uint64_t total = 0;
    rocksdb_iter_seek(it, from, (size_t)from_len);
    if (rocksdb_iter_valid(it)) {
        const char *key = rocksdb_iter_key(it, &first_len);
        first = malloc(first_len + 1);
        if (first == NULL) return 1;
        memcpy(first, key, first_len);
        rocksdb_iter_seek_to_last(it); /* Within the upper bound. */
    }
    if (first != NULL && rocksdb_iter_valid(it)) {
        size_t last_len;
        const char *last = rocksdb_iter_key(it, &last_len);
        /* Numbers of `width` bytes: the keys, zero-padded, and one byte more for precision. */
        width = (first_len > last_len ? first_len : last_len) + 2;
        end = calloc(width, 1), lo = calloc(width, 1), hi = calloc(width, 1);
        mid = calloc(width, 1), last_point = calloc(width, 1);
        if (end == NULL || lo == NULL || hi == NULL || mid == NULL || last_point == NULL) return 1;
        memcpy(end, last, last_len); /* Just above the last key: a 0 byte appended. */
        end_len = last_len + 1;
        total = range_size(db, (const char *)first, first_len, (const char *)end, end_len, &err);
        memcpy(last_point, first, first_len);
        last_point_len = first_len;
    }
    rocksdb_iter_get_error(it, &err);
    for (long i = 1; err == NULL && total > 0 && i < count; i++) {
        uint64_t target = (uint64_t)((long double)total * i / count);
        /* The least key of [lo, hi] whose keys below hold `target` bytes: hi, once mid meets lo. */
        memset(lo, 0, width);
        memcpy(lo, first, first_len);
        memset(hi, 0, width);
        memcpy(hi, end, end_len);
        for (size_t step = 0; step < 8 * width && step < 128; step++) {
            midpoint(lo, hi, mid, width);
            if (memcmp(mid, lo, width) == 0) break;
            uint64_t below =
                range_size(db, (const char *)first, first_len, (const char *)mid, width, &err);
            if (err != NULL) break;
            memcpy(below < target ? lo : hi, mid, width);
        }
        size_t len = width;
        while (len > 0 && hi[len - 1] == 0) len--;
        /* Each point above the one before (the first key, first): no range is empty. */
        size_t common = len < last_point_len ? len : last_point_len;
        int cmp = memcmp(hi, last_point, common);
        if (cmp > 0 || (cmp == 0 && len > last_point_len)) {
            if (print_hex(hi, len) != 0) return 1;
            memcpy(last_point, hi, len);
            last_point_len = len;
        }
    }
    if (err != NULL) {
        fprintf(stderr, "rocksdb-scan: estimating the sizes in %s: %s\n", argv[1], err);
        return 1;
    }
    if (fflush(stdout) != 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--split") == 0) return split_main(argc - 1, argv + 1);
    if (argc < 4 || argc > 7) {
        fprintf(stderr,
                "usage: rocksdb-scan DIR FROM_HEX TO_HEX [BATCH_ROWS [BATCH_BYTES [GET_HEX]]]\n");
        return 2;
    }
    char *from = NULL, *to = NULL, *get = NULL;
    long from_len = parse_hex(argv[2], &from);
    long to_len = strcmp(argv[3], "-") == 0 ? 0 : parse_hex(argv[3], &to);
    long long batch_rows = argc > 4 ? atoll(argv[4]) : 65536;
    long long batch_bytes = argc > 5 ? atoll(argv[5]) : (64LL << 20);
    long get_len = argc > 6 ? parse_hex(argv[6], &get) : 0;
    if (from_len < 0 || to_len < 0 || get_len < 0 || batch_rows <= 0 || batch_bytes <= 0) {
        fprintf(stderr, "rocksdb-scan: bad arguments (keys are hex, counts positive)\n");
        return 2;
    }
    if (write_all(MAGIC, 8) != 0) return 1;
    /* A batch's offsets are i32: it must stay under 2 GiB of keys and of values. */
    if (batch_bytes > (1LL << 30)) batch_bytes = 1LL << 30;
    if (batch_rows > (1LL << 24)) batch_rows = 1LL << 24;

    char *err = NULL;
    rocksdb_options_t *options = rocksdb_options_create();
    rocksdb_t *db = rocksdb_open_for_read_only(options, argv[1], 0, &err);
    if (err != NULL) {
        fprintf(stderr, "rocksdb-scan: opening %s: %s\n", argv[1], err);
        return 1;
    }
    rocksdb_readoptions_t *read = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(read, 0);
    if (get != NULL) {
        size_t value_len = 0;
        char *value = rocksdb_get(db, read, get, (size_t)get_len, &value_len, &err);
        if (err != NULL) {
            fprintf(stderr, "rocksdb-scan: reading %s: %s\n", argv[1], err);
            return 1;
        }
        uint32_t found[2] = {value != NULL, value != NULL ? (uint32_t)value_len : 0};
        if (value != NULL && value_len > UINT32_MAX) {
            fprintf(stderr, "rocksdb-scan: the value read on its own is over 4 GiB\n");
            return 1;
        }
        if (write_all(found, sizeof found) || write_all(value, found[1])) return 1;
        rocksdb_free(value);
    }
    if (to != NULL) rocksdb_readoptions_set_iterate_upper_bound(read, to, (size_t)to_len);
    rocksdb_iterator_t *it = rocksdb_create_iterator(db, read);

    batch_t batch;
    memset(&batch, 0, sizeof batch);
    if (batch_reset(&batch) != 0) return 1;
    for (rocksdb_iter_seek(it, from, (size_t)from_len); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t key_len, value_len;
        const char *key = rocksdb_iter_key(it, &key_len);
        const char *value = rocksdb_iter_value(it, &value_len);
        if (batch.rows > 0 && (batch.rows >= (uint64_t)batch_rows ||
                               batch.keys.len + key_len > (size_t)batch_bytes ||
                               batch.values.len + value_len > (size_t)batch_bytes)) {
            if (batch_flush(&batch) != 0) return 1;
        }
        if (key_len > (1U << 31) - 1 - batch.keys.len ||
            value_len > (1U << 31) - 1 - batch.values.len) {
            fprintf(stderr, "rocksdb-scan: a key or value of over 2 GiB\n");
            return 1;
        }
        if (buf_add(&batch.keys, key, key_len) || buf_add(&batch.values, value, value_len))
            return 1;
        int32_t key_end = (int32_t)batch.keys.len, value_end = (int32_t)batch.values.len;
        if (buf_add(&batch.key_offsets, &key_end, 4) ||
            buf_add(&batch.value_offsets, &value_end, 4))
            return 1;
        batch.rows++;
    }
    rocksdb_iter_get_error(it, &err);
    if (err != NULL) {
        fprintf(stderr, "rocksdb-scan: reading %s: %s\n", argv[1], err);
        return 1;
    }
    if (batch.rows > 0 && batch_flush(&batch) != 0) return 1;
    if (batch_flush(&batch) != 0) return 1; /* the end frame: 0 rows */
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(read);
    rocksdb_close(db);
    rocksdb_options_destroy(options);
    return 0;
}
