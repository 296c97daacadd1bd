/* SPDX-License-Identifier: MIT */
/*
 * lib/tensor_tree, lib/tensor_files, lib/tensor_layer: names as paths
 * (docs/TENSOR_TREE.md), the tree index, .npy layouts and plans, and plans
 * read through a view.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"
#include "plan/plan_build.h"
#include "tensors/tensor_files.h"
#include "plan/plan_layer.h"
#include "tensors/tensor_tree.h"
#include "testutil.h"
#include "view/view.h"
#include "unit.h"

/* ---- names as paths ---- */

static const struct {
	const char *name;
	size_t len; /* 0: strlen */
	const char *path;
} paths[] = {
	{ "model.layers.0.self_attn.q_proj.weight", 0,
	  "model/layers/0/self_attn/q_proj/weight" },
	{ "x/y", 0, "x%2Fy" },
	{ "a..b", 0, "a/%/b" },
	{ "..", 0, "%/%/%" },
	{ ".", 0, "%/%" },
	{ "", 0, "%" },
	{ "a.", 0, "a/%" },
	{ ".a", 0, "%/a" },
	{ "100%.w", 0, "100%25/w" },
	{ "q%+", 0, "q%25+" },
	{ "tab\there", 0, "tab%09here" },
	{ "nul\0x", 5, "nul%00x" },
	{ "del\x7f", 0, "del%7F" },
	{ "sp ace.#h\xc3\xa9", 0, "sp ace/#h\xc3\xa9" },
};

START_TEST(test_tpath__known_spellings)
{
	size_t len = paths[_i].len ? paths[_i].len : strlen(paths[_i].name);
	char *p, *n;
	size_t pl, nl;

	ck_assert_int_eq(castfs_tpath_encode(paths[_i].name, len, &p, &pl), 0);
	ck_assert_str_eq(p, paths[_i].path);
	ck_assert_uint_eq(pl, strlen(p));
	ck_assert_int_eq(castfs_tpath_decode(p, pl, &n, &nl), 0);
	ck_assert_uint_eq(nl, len);
	ck_assert_mem_eq(n, paths[_i].name, len);
	free(p);
	free(n);
}
END_TEST

/* Every component: non-empty, dot-free, at most 250 bytes. */
static void check_components(const char *p, size_t len)
{
	size_t start = 0;

	for (size_t i = 0; i <= len; i++) {
		if (i < len && p[i] != '/')
			continue;
		ck_assert_uint_gt(i - start, 0);
		ck_assert_uint_le(i - start, CASTFS_TPATH_COMPONENT_MAX);
		ck_assert_ptr_null(memchr(p + start, '.', i - start));
		ck_assert_ptr_null(memchr(p + start, '\0', i - start));
		start = i + 1;
	}
}

START_TEST(test_tpath__long_parts_are_cut)
{
	char name[1203], *p, *n;
	size_t pl, nl;

	/* 600 'p', a dot, 300 two-byte UTF-8 characters, a dot, "w". */
	memset(name, 'p', 600);
	name[600] = '.';
	for (int i = 0; i < 300; i++)
		memcpy(name + 601 + 2 * i, "\xc3\xa9", 2);
	memcpy(name + 1201, ".w", 2);
	ck_assert_int_eq(castfs_tpath_encode(name, sizeof(name), &p, &pl), 0);
	check_components(p, pl);
	ck_assert_ptr_nonnull(strstr(p, "%+/"));
	/* No cut inside a UTF-8 character: no component starts with a
	 * continuation byte. */
	for (size_t i = 1; i < pl; i++) {
		if (p[i - 1] == '/')
			ck_assert((unsigned char)p[i] < 0x80 ||
				  (unsigned char)p[i] >= 0xc0);
	}
	ck_assert_int_eq(castfs_tpath_decode(p, pl, &n, &nl), 0);
	ck_assert_uint_eq(nl, sizeof(name));
	ck_assert_mem_eq(n, name, nl);
	free(p);
	free(n);
}
END_TEST

START_TEST(test_tpath__escapes_are_never_cut)
{
	char name[400], *p, *n;
	size_t pl, nl;

	for (size_t shift = 0; shift < 3; shift++) {
		memset(name, 'a', shift);
		memset(name + shift, '/', sizeof(name) - shift);
		ck_assert_int_eq(
			castfs_tpath_encode(name, sizeof(name), &p, &pl), 0);
		check_components(p, pl);
		ck_assert_int_eq(castfs_tpath_decode(p, pl, &n, &nl), 0);
		ck_assert_uint_eq(nl, sizeof(name));
		ck_assert_mem_eq(n, name, nl);
		free(p);
		free(n);
	}
}
END_TEST

START_TEST(test_tpath__random_names_round_trip)
{
	static const char alphabet[] = "ab./%+\0\x01\xc3\xa9 ";
	uint64_t seed = 42;

	for (int iter = 0; iter < 20000; iter++) {
		size_t len = tu_rand(&seed) % (iter % 100 ? 24 : 700);
		char name[700], *p, *n;
		size_t pl, nl;

		for (size_t i = 0; i < len; i++)
			name[i] = alphabet[tu_rand(&seed) %
					   (sizeof(alphabet) - 1)];
		ck_assert_int_eq(castfs_tpath_encode(name, len, &p, &pl), 0);
		check_components(p, pl);
		ck_assert_int_eq(castfs_tpath_decode(p, pl, &n, &nl), 0);
		ck_assert_uint_eq(nl, len);
		ck_assert_mem_eq(n, name, len);
		free(p);
		free(n);
	}
}
END_TEST

START_TEST(test_tpath__other_spellings_are_refused)
{
	static const char *const bad[] = {
		"%41", "a/",   "/a",	"a//b", "%+", "a%2",	 "a%zz",
		"a.b", "a%2f", "x%+/y", "%%",	"%/", "a%+%+/b", "",
	};
	char *n;
	size_t nl;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(castfs_tpath_decode(bad[i], strlen(bad[i]), &n,
						  &nl) == -EINVAL,
			      "accepted '%s'", bad[i]);
}
END_TEST

/* ---- the index ---- */

static struct castfs_header *parse_names(const char *const *names, size_t n)
{
	struct tu_st *b = tu_st_new();
	const uint64_t shape[1] = { 2 };
	struct castfs_header *h;
	uint8_t *file;
	size_t len;

	for (size_t i = 0; i < n; i++)
		tu_st_add(b, names[i], "F32", 1, shape, NULL);
	file = tu_st_build(b, &len);
	ck_assert_int_eq(castfs_header_parse(file, len, len, &h, NULL), 0);
	free(file);
	tu_st_free(b);
	return h;
}

struct seen {
	char names[16][32];
	bool leaf[16];
	size_t n;
};

static int collect(void *ctx, const char *name, size_t len,
		   const struct castfs_ttree_entry *leaf)
{
	struct seen *s = ctx;

	ck_assert_uint_lt(s->n, 16);
	memcpy(s->names[s->n], name, len);
	s->names[s->n][len] = '\0';
	s->leaf[s->n++] = leaf != NULL;
	return 0;
}

START_TEST(test_ttree__lookup_and_children)
{
	static const char *const names[] = { "a.b", "a.b.c", "a.x",
					     "b",   "a%.q",  "a/z" };
	struct castfs_header *h = parse_names(names, 6);
	struct castfs_ttree *tt;
	struct seen s = { 0 };

	ck_assert_int_eq(castfs_ttree_build(h, &tt), 0);
	ck_assert_ptr_nonnull(castfs_ttree_find(tt, "a/b", 3));
	ck_assert_str_eq(castfs_ttree_find(tt, "a/b/c", 5)->t->name, "a.b.c");
	ck_assert_ptr_null(castfs_ttree_find(tt, "a", 1));
	ck_assert(castfs_ttree_is_dir(tt, "a", 1));
	ck_assert(castfs_ttree_is_dir(tt, "a/b", 3));
	ck_assert(!castfs_ttree_is_dir(tt, "a/x", 3));
	ck_assert(!castfs_ttree_is_dir(tt, "b", 1));
	ck_assert(castfs_ttree_is_dir(tt, "", 0));
	ck_assert_int_eq(castfs_ttree_children(tt, "", 0, collect, &s), 0);
	/* Sorted by path bytes: '%' < '/', so "a%25/q" < "a%2Fz" < "a/b". */
	ck_assert_uint_eq(s.n, 4);
	ck_assert_str_eq(s.names[0], "a%25");
	ck_assert(!s.leaf[0]);
	ck_assert_str_eq(s.names[1], "a%2Fz");
	ck_assert(s.leaf[1]);
	ck_assert_str_eq(s.names[2], "a");
	ck_assert(!s.leaf[2]);
	ck_assert_str_eq(s.names[3], "b");
	ck_assert(s.leaf[3]);
	memset(&s, 0, sizeof(s));
	ck_assert_int_eq(castfs_ttree_children(tt, "a", 1, collect, &s), 0);
	ck_assert_uint_eq(s.n, 3); /* b (tensor), b (directory), x */
	ck_assert_str_eq(s.names[0], "b");
	ck_assert_str_eq(s.names[1], "b");
	ck_assert(s.leaf[0] != s.leaf[1]);
	ck_assert_str_eq(s.names[2], "x");
	castfs_ttree_free(tt);
	castfs_header_free(h);
}
END_TEST

/* ---- .npy ---- */

START_TEST(test_npy__header_as_numpy_writes_it)
{
	/* np.save(f, np.zeros((2, 3), np.float32)), first 128 bytes. */
	static const char want[] =
		"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': "
		"False, 'shape': (2, 3), }";
	const uint64_t shape[2] = { 2, 3 };
	struct castfs_tensor t = { .name = "w",
				   .name_len = 1,
				   .dtype = CASTFS_DTYPE_BF16,
				   .ndim = 2,
				   .shape = shape,
				   .nelems = 6,
				   .begin = 0,
				   .end = 12 };
	struct castfs_npy n;

	ck_assert_int_eq(castfs_npy_layout(&t, &n), 0);
	ck_assert_int_eq(n.kind, CASTFS_NPY_WIDEN);
	ck_assert_uint_eq(n.header_len, 128);
	ck_assert_mem_eq(n.header, want, sizeof(want) - 1);
	for (size_t i = sizeof(want) - 1; i < 127; i++)
		ck_assert_int_eq(n.header[i], ' ');
	ck_assert_int_eq(n.header[127], '\n');
	ck_assert_uint_eq(n.size, 128 + 24);
	castfs_npy_fini(&n);
}
END_TEST

START_TEST(test_npy__big_headers_use_format_2)
{
	enum { NDIM = 30000 };
	uint64_t *shape = malloc(NDIM * sizeof(*shape));
	struct castfs_tensor t = {
		.dtype = CASTFS_DTYPE_U8, .ndim = NDIM, .nelems = 1, .end = 1
	};
	struct castfs_npy n;

	for (int i = 0; i < NDIM; i++)
		shape[i] = 1;
	t.shape = shape;
	ck_assert_int_eq(castfs_npy_layout(&t, &n), 0);
	ck_assert_int_eq(n.header[6], 2);
	ck_assert_uint_eq(n.header_len % 64, 0);
	ck_assert_uint_eq(n.header[8] | n.header[9] << 8 | n.header[10] << 16,
			  n.header_len - 12);
	castfs_npy_fini(&n);
	free(shape);
}
END_TEST

START_TEST(test_npy__kinds_and_shapes)
{
	const uint64_t shape[2] = { 3, 4 };
	struct castfs_tensor t = { .ndim = 2, .shape = shape, .nelems = 12 };
	struct castfs_npy n;

	t.dtype = CASTFS_DTYPE_F8_E8M0;
	t.end = 12;
	ck_assert_int_eq(castfs_npy_layout(&t, &n), 0);
	ck_assert_int_eq(n.kind, CASTFS_NPY_BYTES);
	ck_assert_str_eq(n.descr, "|u1");
	ck_assert_uint_eq(n.ndim, 2);
	castfs_npy_fini(&n);
	t.dtype = CASTFS_DTYPE_F4;
	t.end = 6;
	ck_assert_int_eq(castfs_npy_layout(&t, &n), 0);
	ck_assert_uint_eq(n.shape[1], 2); /* pairs, as torch packs them */
	ck_assert_uint_eq(n.data_len, 6);
	castfs_npy_fini(&n);
	t.dtype = CASTFS_DTYPE_I16;
	t.end = 24;
	ck_assert_int_eq(castfs_npy_layout(&t, &n), 0);
	ck_assert_int_eq(n.kind, CASTFS_NPY_COPY);
	ck_assert_str_eq(n.descr, "<i2");
	castfs_npy_fini(&n);
}
END_TEST

/* ---- a plan read through a view ---- */

START_TEST(test_layer__npy_of_a_view_widens_the_view)
{
	struct castfs_views vs;
	const uint64_t shape[2] = { 300, 257 };
	struct tu_st *b = tu_st_new();
	struct castfs_header *h, *vh;
	struct castfs_plan *view, *npy;
	struct castfs_mem_reader mr;
	struct castfs_scratch s, outer;
	struct castfs_plan_layer l;
	uint8_t *file, *vbytes, *got;
	float *want;
	size_t len;
	uint64_t seed = 7;

	tu_st_add(b, "w", "BF16", 2, shape, NULL);
	file = tu_st_build(b, &len);
	ck_assert_int_eq(castfs_header_parse(file, len, len, &h, NULL), 0);
	ck_assert_int_eq(castfs_views_builtin(&vs), 0);
	ck_assert_int_eq(castfs_view_plan(castfs_views_find(&vs, "fp8", 3), h,
					  &view, NULL),
			 0);
	ck_assert_int_eq(castfs_plan_header(view, &vh, NULL), 0);
	ck_assert_int_eq(vh->tensors[0].dtype, CASTFS_DTYPE_F8_E4M3);
	ck_assert_int_eq(castfs_npy_plan(&vh->tensors[0],
					 vh->data_start + vh->tensors[0].begin,
					 &npy),
			 0);
	castfs_mem_reader_init(&mr, file, len);
	ck_assert_int_eq(castfs_scratch_init(&s), 0);
	vbytes = malloc(view->size);
	ck_assert_int_eq(castfs_plan_read(view, &mr.r, &s, vbytes, view->size,
					  0),
			 (ssize_t)view->size);
	want = malloc(300 * 257 * sizeof(float));
	castfs_convert_get(CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F32,
			   0)(want, vbytes + vh->data_start, 300 * 257);
	got = malloc(npy->size);
	castfs_plan_layer_init(&l, view, &mr.r, &s, &outer);
	ck_assert_int_eq(castfs_plan_read(npy, &l.r, &outer, got, npy->size, 0),
			 (ssize_t)npy->size);
	ck_assert_mem_eq(got + 128, want, 300 * 257 * sizeof(float));
	/* Ranges cutting elements, through the layer. */
	for (int i = 0; i < 500; i++) {
		uint64_t off = tu_rand(&seed) % npy->size;
		size_t n = (size_t)(tu_rand(&seed) % (npy->size - off)) + 1;
		uint8_t *part = malloc(n);

		ck_assert_int_eq(castfs_plan_read(npy, &l.r, &outer, part, n,
						  off),
				 (ssize_t)n);
		ck_assert_mem_eq(part, got + off, n);
		free(part);
	}
	free(got);
	free(want);
	free(vbytes);
	castfs_scratch_fini(&s);
	castfs_plan_free(npy);
	castfs_header_free(vh);
	castfs_plan_free(view);
	castfs_views_fini(&vs);
	castfs_header_free(h);
	free(file);
	tu_st_free(b);
}
END_TEST

/* ---- long generated files, per read range ---- */

static const struct castfs_reader no_source = { 0 };

/*
 * Every odd range of @p against @want (@len bytes): empty, each of the
 * first and last 300 bytes alone, pairs straddling every byte near the
 * start, random ranges (many straddling list items and extents), and
 * ranges running past the end or starting there.
 */
static void ranges_match(const struct castfs_plan *p, const uint8_t *want,
			 size_t len, uint64_t seed)
{
	struct castfs_scratch s;
	uint8_t *got = malloc(len + 64);

	ck_assert_uint_eq(p->size, len);
	ck_assert_int_eq(castfs_scratch_init(&s), 0);
	ck_assert_int_eq(castfs_plan_read(p, &no_source, &s, got, len + 64, 0),
			 (ssize_t)len);
	ck_assert_mem_eq(got, want, len);
	ck_assert_int_eq(castfs_plan_read(p, &no_source, &s, got, 0, 0), 0);
	ck_assert_int_eq(castfs_plan_read(p, &no_source, &s, got, 8, len), 0);
	ck_assert_int_eq(castfs_plan_read(p, &no_source, &s, got, 8, len + 9),
			 0);
	for (size_t i = 0; i < len; i++) {
		size_t n = i + 2 <= len ? 2 : 1;

		if (i == 300 && len > 600)
			i = len - 300;
		ck_assert_int_eq(castfs_plan_read(p, &no_source, &s, got, n, i),
				 (ssize_t)n);
		ck_assert_mem_eq(got, want + i, n);
	}
	for (int k = 0; k < 2000; k++) {
		uint64_t off = tu_rand(&seed) % len;
		size_t n = (size_t)(tu_rand(&seed) % (k % 2 ? 64 : len)) + 1;
		size_t want_n = n < len - off ? n : len - off;

		ck_assert_int_eq(castfs_plan_read(p, &no_source, &s, got, n,
						  off),
				 (ssize_t)want_n);
		ck_assert_mem_eq(got, want + off, want_n);
	}
	castfs_scratch_fini(&s);
	free(got);
}

/* Values of every digit count, 0 and UINT64_MAX among them. */
static uint64_t odd_value(uint64_t *seed)
{
	uint64_t r = tu_rand(seed);
	unsigned digits = (unsigned)(r % 21);
	uint64_t v = tu_rand(seed);

	if (digits == 0)
		return r % 3 ? 0 : UINT64_MAX;
	for (unsigned i = digits; i < 20; i++)
		v /= 10;
	return v;
}

static const uint64_t ints_counts[] = { 1, 2, 255, 256, 257, 513, 5000 };

START_TEST(test_ints__ranges_match_snprintf)
{
	uint64_t n = ints_counts[_i], seed = 11 + n;
	uint64_t *v = malloc(n * sizeof(*v));
	char *want = malloc(n * 22 + 3);
	size_t len = 0;
	struct castfs_producer mem = { .op = CASTFS_OP_MEM };
	struct castfs_plan *p;
	struct castfs_pb *pb;

	want[len++] = '[';
	for (uint64_t i = 0; i < n; i++) {
		v[i] = odd_value(&seed);
		len += (size_t)sprintf(want + len, "%s%" PRIu64, i ? ", " : "",
				       v[i]);
	}
	want[len++] = ']';
	ck_assert_uint_eq(castfs_ints_len(v, n), len - 2);
	ck_assert_int_eq(castfs_pb_new(&pb), 0);
	mem.mem = "[";
	ck_assert_int_eq(castfs_pb_append(pb, &mem, 1), 0);
	ck_assert_int_eq(castfs_pb_append_ints(pb, v, n), 0);
	mem.mem = "]";
	ck_assert_int_eq(castfs_pb_append(pb, &mem, 1), 0);
	ck_assert_int_eq(castfs_pb_finish_raw(pb, &p), 0);
	ck_assert_uint_eq(p->nextents, 3);
	ranges_match(p, (const uint8_t *)want, len, seed);
	castfs_plan_free(p);
	free(want);
	free(v);
}
END_TEST

/* Tensors whose .info and .npy grow with the shape. */
static const struct {
	enum castfs_dtype dtype;
	uint32_t ndim;
} long_shapes[] = {
	{ CASTFS_DTYPE_F32, 0 },       { CASTFS_DTYPE_F32, 1 },
	{ CASTFS_DTYPE_BF16, 63 },     { CASTFS_DTYPE_F32, 64 },
	{ CASTFS_DTYPE_I64, 300 },     { CASTFS_DTYPE_F4, 700 },
	{ CASTFS_DTYPE_F8_E8M0, 700 }, { CASTFS_DTYPE_F4, 1 },
	{ CASTFS_DTYPE_BF16, 30000 }, /* .npy format 2.0 */
};

/* A tensor of @ndim dims, of 1 but a few (so one element or a few). */
static void long_tensor(struct castfs_tensor *t, uint64_t *shape, int i)
{
	uint32_t nd = long_shapes[i].ndim;
	uint64_t n = 1;

	for (uint32_t k = 0; k < nd; k++) {
		shape[k] = k == 0 || k + 1 == nd ? 2 : 1;
		if (k == nd / 2)
			shape[k] = 12345678901ull % 7 + 1; /* 6 */
		n *= shape[k];
	}
	*t = (struct castfs_tensor){
		.name = "w.\"q\"",
		.name_len = 5,
		.dtype = long_shapes[i].dtype,
		.ndim = nd,
		.shape = shape,
		.nelems = n,
		.begin = 64,
		.end = 64 + n * castfs_dtype_bits(long_shapes[i].dtype) / 8
	};
}

START_TEST(test_tinfo__plan_reads_as_the_text)
{
	uint64_t *shape = malloc((long_shapes[_i].ndim + 1) * sizeof(*shape));
	struct castfs_header h = { .data_start = 8 + 4096 };
	struct castfs_tfile_ctx c = { .h = &h, .file = "dir/m.safetensors" };
	struct castfs_tensor t;
	struct castfs_plan *p;
	size_t len, mem = 0;
	char *want;

	long_tensor(&t, shape, _i);
	want = castfs_tinfo_text(&c, &t, &len);
	ck_assert_ptr_nonnull(want);
	ck_assert_int_eq(castfs_tinfo_plan(&c, &t, &p), 0);
	ranges_match(p, (const uint8_t *)want, len, 5 + (uint64_t)_i);
	/* Long shapes are not held as text. */
	for (size_t k = 0; k < p->nextents; k++)
		mem += p->extents[k].op == CASTFS_OP_MEM ? p->extents[k].len :
							   0;
	if (t.ndim >= 64)
		ck_assert_uint_lt(mem, 400);
	else
		ck_assert_uint_eq(p->nextents, 1);
	castfs_plan_free(p);
	free(want);
	free(shape);
}
END_TEST

START_TEST(test_npy__plan_header_is_the_layout_header)
{
	uint64_t *shape = malloc((long_shapes[_i].ndim + 1) * sizeof(*shape));
	struct castfs_tensor t;
	struct castfs_plan *p;
	struct castfs_npy n;

	long_tensor(&t, shape, _i);
	ck_assert_int_eq(castfs_npy_layout(&t, &n), 0);
	ck_assert_int_eq(castfs_npy_plan(&t, 0, &p), 0);
	ck_assert_uint_eq(p->size, n.size);
	ck_assert_uint_eq(p->extents[p->nextents - 1].out_off, n.header_len);
	p->size = n.header_len; /* the header's ranges only: no source */
	ranges_match(p, n.header, n.header_len, 9 + (uint64_t)_i);
	castfs_plan_free(p);
	castfs_npy_fini(&n);
	free(shape);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("tensor_tree");
	TCase *tc = tcase_create("paths");

	tcase_add_loop_test(tc, test_tpath__known_spellings, 0,
			    sizeof(paths) / sizeof(paths[0]));
	tcase_add_test(tc, test_tpath__long_parts_are_cut);
	tcase_add_test(tc, test_tpath__escapes_are_never_cut);
	tcase_add_test(tc, test_tpath__random_names_round_trip);
	tcase_add_test(tc, test_tpath__other_spellings_are_refused);
	suite_add_tcase(s, tc);
	tc = tcase_create("index");
	tcase_add_test(tc, test_ttree__lookup_and_children);
	suite_add_tcase(s, tc);
	tc = tcase_create("files");
	tcase_add_test(tc, test_npy__header_as_numpy_writes_it);
	tcase_add_test(tc, test_npy__big_headers_use_format_2);
	tcase_add_test(tc, test_npy__kinds_and_shapes);
	tcase_add_test(tc, test_layer__npy_of_a_view_widens_the_view);
	suite_add_tcase(s, tc);
	tc = tcase_create("per range");
	tcase_add_loop_test(tc, test_ints__ranges_match_snprintf, 0,
			    sizeof(ints_counts) / sizeof(ints_counts[0]));
	tcase_add_loop_test(tc, test_tinfo__plan_reads_as_the_text, 0,
			    sizeof(long_shapes) / sizeof(long_shapes[0]));
	tcase_add_loop_test(tc, test_npy__plan_header_is_the_layout_header, 0,
			    sizeof(long_shapes) / sizeof(long_shapes[0]));
	suite_add_tcase(s, tc);
	return s;
}
