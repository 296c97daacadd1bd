/* SPDX-License-Identifier: MIT */
/*
 * bitsandbytes quantiser math: the code tables, the selection rules
 * (docs/FORMATS.md, "bitsandbytes views") and per-ISA kernels applying them.
 * Pure functions: no I/O, no allocation; private to lib/.
 */
#ifndef CASTFS_QUANT_H
#define CASTFS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/convert.h"

/* Quantisation kinds of a quantised tensor. */
enum castfs_qtype {
	CASTFS_Q_NF4,
	CASTFS_Q_FP4,
	CASTFS_Q_INT8,
	CASTFS_Q_F8, /* compressed-tensors scaled fp8 (blk_rows x blk_cols) */
	CASTFS_Q_W4, /* compressed-tensors int4, symmetric, 1 x blk_cols */
	CASTFS_Q_NVFP4, /* compressed-tensors NVFP4: fp4 e2m1, 1 x 16 */
	CASTFS_Q_COMFY_F8, /* ComfyUI scaled fp8: e4m3, one F32 scale */
	CASTFS_Q_GGUF_Q8_0, /* ggml Q8_0 blocks (quant_gguf.h) */
	CASTFS_Q_GGUF_Q4_0, /* ggml Q4_0 blocks */
	CASTFS_Q_GGUF_Q5_0, /* ggml Q5_0, Q5_1 blocks (quant_gguf_k.h) */
	CASTFS_Q_GGUF_Q5_1,
	CASTFS_Q_GGUF_Q4_K, /* ggml K-quant super-blocks (quant_gguf_k.h) */
	CASTFS_Q_GGUF_Q5_K,
	CASTFS_Q_GGUF_Q6_K,
	CASTFS_Q_GGUF_Q4_1, /* ggml Q4_1 blocks (quant_gguf_k.h) */
};

/* Absmax values per nested (double-quantisation) block, as in bnb. */
#define CASTFS_Q_NESTED_BLOCK 256u

/* Characters reserved for nested_offset in the quant_state JSON. */
#define CASTFS_Q4_OFFSET_WIDTH 24u

/* Room for any quant_state JSON castfs_q4_state_json() writes. */
#define CASTFS_Q4_STATE_MAX 512u

/*
 * castfs_q4_table - the 16 float32 values of 4-bit code @qt, indexed by
 * code, bit-identical to bitsandbytes' get_4bit_type() (FP4 code 8 is
 * +0.0). @qt must be CASTFS_Q_NF4 or CASTFS_Q_FP4. Never NULL.
 */
const float *castfs_q4_table(enum castfs_qtype qt);

/*
 * castfs_q_dynmap - the 256 ascending float32 values of castfs' 8-bit
 * dynamic map (bnb create_dynamic_map() as computed by a scalar linspace;
 * entry 127 is 0.0, entry 255 is 1.0). Stored as nested_quant_map.
 */
const float *castfs_q_dynmap(void);

/*
 * castfs_q_absmax - the largest |x| over the finite elements of @x[0..@n);
 * NaN and +-Inf are skipped; 0.0 when there is none.
 */
float castfs_q_absmax(const float *x, size_t n);

/*
 * castfs_q_scale - the 4-bit / 8-bit block scale fl32(1 / max(@absmax,
 * 1e-38)), as bitsandbytes computes it (the clamp keeps it finite).
 */
float castfs_q_scale(float absmax);

/*
 * castfs_q4_code - the code of one element @x of a block with scale
 * @scale: s = fl32(x * scale) (NaN counts as 0), then the position of s
 * among the ascending code values where s goes up one position for each
 * float32 midpoint it exceeds (a tie stays at the lower value), mapped back
 * to the code. +-Inf give the codes of +-1.0.
 */
uint8_t castfs_q4_code(float x, float scale, enum castfs_qtype qt);

/*
 * castfs_q8_code - the dynamic-map code of @v (a block absmax minus the
 * offset) in a nested block with scale @scale: the same rule as
 * castfs_q4_code() over the 256 values of castfs_q_dynmap().
 */
uint8_t castfs_q8_code(float v, float scale);

/*
 * castfs_i8_scale - the LLM.int8 row scale fl32(fl32(1 / @absmax) * 127)
 * (torch's 127.0 / tensor), or 0 for an all-zero row (codes all 0).
 */
float castfs_i8_scale(float absmax);

/*
 * castfs_i8_code - round_half_even(fl32(@x * @scale)) clamped to
 * [-127, 127]; NaN gives 0, +-Inf give +-127.
 */
int8_t castfs_i8_code(float x, float scale);

/* Kernels: one table per ISA, each entry bit-identical to the scalar one. */
struct castfs_quant_kernels {
	/*
	 * Absmax (castfs_q_absmax) of each block of @bs elements of @x into
	 * @amax; @n elements, the last block may be short.
	 */
	void (*absmax)(float *restrict amax, const float *restrict x, size_t n,
		       size_t bs);
	/*
	 * 4-bit codes of @n elements in blocks of @bs (@bs even; each block
	 * scaled by its own absmax), packed two per byte with element 2k in
	 * the high nibble: (@n + 1) / 2 bytes. An odd @n is padded with 0.0.
	 */
	void (*q4)(uint8_t *restrict dst, const float *restrict x, size_t n,
		   size_t bs, enum castfs_qtype qt);
	/* int8 codes (castfs_i8_code) of @n elements with one @scale. */
	void (*i8)(int8_t *restrict dst, const float *restrict x, size_t n,
		   float scale);
	/*
	 * absmax() of 16-bit floats read as they are: @x holds @n
	 * little-endian BF16 (or F16 when @f16) values, at any alignment.
	 * The same values as absmax() of their float32 widening, without
	 * staging it: most checkpoints are BF16.
	 */
	void (*absmax16)(float *restrict amax, const void *restrict x, size_t n,
			 size_t bs, bool f16);
	/*
	 * q4() of 16-bit floats read as they are (as absmax16): the same
	 * bytes as q4() of their float32 widening. When @amax is not NULL,
	 * each block's absmax goes there too (the values absmax16 gives).
	 */
	void (*q4_16)(uint8_t *restrict dst, float *restrict amax,
		      const void *restrict x, size_t n, size_t bs,
		      enum castfs_qtype qt, bool f16);
	/*
	 * Double quantisation of @n block absmax values of one nested block:
	 * dst[i] = castfs_q8_code(amax[i] - offset, scale).
	 */
	void (*q8)(uint8_t *restrict dst, const float *restrict amax, size_t n,
		   float offset, float scale);
};

/*
 * castfs_quant_kernels_get - the kernels of the ISA castfs_isa_selected()
 * chose for this process. Never NULL. Thread-safe.
 */
const struct castfs_quant_kernels *castfs_quant_kernels_get(void);

/*
 * castfs_quant_kernels_isa - the kernels of @isa, or NULL when @isa is not
 * built in or this CPU cannot run it. For tests and benchmarks.
 */
const struct castfs_quant_kernels *
castfs_quant_kernels_isa(enum castfs_isa isa);

/*
 * castfs_q_pyfloat - @v as Python's repr(float) spells it (shortest string
 * that reads back as @v; "1e-05", "0.0001", "1.0"; "NaN", "Infinity" as
 * json.dumps writes them) into @buf of @cap bytes, NUL-terminated.
 * Returns the length, or -ENOSPC when @cap is too small. Thread-safe.
 */
int castfs_q_pyfloat(char *buf, size_t cap, double v);

/* What a 4-bit quant_state JSON says. */
struct castfs_q4_state {
	enum castfs_qtype qtype;
	uint32_t blocksize;
	const char *dtype; /* torch dtype name without "torch." */
	uint64_t rows, cols;
	bool nested;
};

/*
 * castfs_q4_state_json - the quant_state JSON bitsandbytes' QuantState
 * .as_dict(packed=True) would pack, byte for byte as Python's json.dumps
 * writes it, into @buf (@cap bytes). When @st->nested, nested_offset is a
 * field of CASTFS_Q4_OFFSET_WIDTH spaces starting at *@num_off, to be
 * overwritten by castfs_q4_state_offset(); otherwise *@num_off is 0.
 * Returns the length (not NUL-terminated), or -ENOSPC.
 */
int castfs_q4_state_json(char *buf, size_t cap,
			 const struct castfs_q4_state *st, size_t *num_off);

/*
 * castfs_q4_state_offset - the CASTFS_Q4_OFFSET_WIDTH bytes of the
 * nested_offset field for @offset: its repr, then spaces (valid JSON
 * whitespace before the closing brace). Cannot fail for a float32 value.
 */
void castfs_q4_state_offset(char field[CASTFS_Q4_OFFSET_WIDTH], float offset);

#endif
