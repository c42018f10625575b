// CRC-32 (IEEE, bit-reflected) folding with AVX-512 carry-less multiplies: four 512-bit
// accumulators, 256 bytes a round. The standard library's AVX-512 path keeps one
// accumulator, so every round waits for the previous round's multiply; four independent
// chains keep the multiplier busy. See crc_amd64.go.

#include "textflag.h"

// Folding constants: for a 128-bit lane moved forward by D bits, the low quadword (the
// earlier bytes: higher powers) is multiplied by x^(D+32) mod P and the high one by
// x^(D-32) mod P, both bit-reflected and
// shifted left by one (crc_test.go derives them). Repeated for each 128-bit lane.
DATA fold2048<>+0(SB)/8, $0x11542778a
DATA fold2048<>+8(SB)/8, $0x1322d1430
DATA fold2048<>+16(SB)/8, $0x11542778a
DATA fold2048<>+24(SB)/8, $0x1322d1430
DATA fold2048<>+32(SB)/8, $0x11542778a
DATA fold2048<>+40(SB)/8, $0x1322d1430
DATA fold2048<>+48(SB)/8, $0x11542778a
DATA fold2048<>+56(SB)/8, $0x1322d1430
GLOBL fold2048<>(SB), RODATA|NOPTR, $64

DATA fold512<>+0(SB)/8, $0x154442bd4
DATA fold512<>+8(SB)/8, $0x1c6e41596
DATA fold512<>+16(SB)/8, $0x154442bd4
DATA fold512<>+24(SB)/8, $0x1c6e41596
DATA fold512<>+32(SB)/8, $0x154442bd4
DATA fold512<>+40(SB)/8, $0x1c6e41596
DATA fold512<>+48(SB)/8, $0x154442bd4
DATA fold512<>+56(SB)/8, $0x1c6e41596
GLOBL fold512<>(SB), RODATA|NOPTR, $64

DATA fold128<>+0(SB)/8, $0x1751997d0
DATA fold128<>+8(SB)/8, $0xccaa009e
GLOBL fold128<>(SB), RODATA|NOPTR, $16

// FOLD4 moves the four accumulators Z1-Z4 forward by 256 bytes (constants in Z0) and adds
// the next 256 bytes, loaded in Z9-Z12.
#define FOLD4 \
	VPCLMULQDQ $0x00, Z0, Z1, Z5; \
	VPCLMULQDQ $0x11, Z0, Z1, Z1; \
	VPCLMULQDQ $0x00, Z0, Z2, Z6; \
	VPCLMULQDQ $0x11, Z0, Z2, Z2; \
	VPCLMULQDQ $0x00, Z0, Z3, Z7; \
	VPCLMULQDQ $0x11, Z0, Z3, Z3; \
	VPCLMULQDQ $0x00, Z0, Z4, Z8; \
	VPCLMULQDQ $0x11, Z0, Z4, Z4; \
	VPTERNLOGD $0x96, Z9, Z5, Z1; \
	VPTERNLOGD $0x96, Z10, Z6, Z2; \
	VPTERNLOGD $0x96, Z11, Z7, Z3; \
	VPTERNLOGD $0x96, Z12, Z8, Z4

// func foldAVX512(crc uint32, p []byte, dst *byte, out *[16]byte)
// len(p) >= 256 and a multiple of 64; crc is the raw (uninverted) register. If dst is not
// nil, p is also copied there (as it is loaded: the copy costs its stores only).
TEXT ·foldAVX512(SB), NOSPLIT, $0-48
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ dst+32(FP), DX
	MOVQ out+40(FP), DI

	// The first 256 bytes, with the register XORed into the first four.
	VMOVD     AX, X0
	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	TESTQ     DX, DX
	JZ        first
	VMOVDQU64 Z1, 0(DX)
	VMOVDQU64 Z2, 64(DX)
	VMOVDQU64 Z3, 128(DX)
	VMOVDQU64 Z4, 192(DX)
	ADDQ      $256, DX

first:
	VPXORQ    Z0, Z1, Z1
	ADDQ      $256, SI
	SUBQ      $256, CX
	VMOVDQU64 fold2048<>(SB), Z0
	CMPQ      CX, $256
	JB        reduce4
	TESTQ     DX, DX
	JNZ       loop256copy

	PCALIGN $32
loop256:
	VMOVDQU64  0(SI), Z9
	VMOVDQU64  64(SI), Z10
	VMOVDQU64  128(SI), Z11
	VMOVDQU64  192(SI), Z12
	FOLD4
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop256
	JMP        reduce4

	// The same, storing what it loads at DX.
	PCALIGN $32
loop256copy:
	VMOVDQU64  0(SI), Z9
	VMOVDQU64  64(SI), Z10
	VMOVDQU64  128(SI), Z11
	VMOVDQU64  192(SI), Z12
	VMOVDQU64  Z9, 0(DX)
	VMOVDQU64  Z10, 64(DX)
	VMOVDQU64  Z11, 128(DX)
	VMOVDQU64  Z12, 192(DX)
	FOLD4
	ADDQ       $256, SI
	ADDQ       $256, DX
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop256copy

reduce4:
	// Fold the four accumulators into the last, 64 bytes apart.
	VMOVDQU64  fold512<>(SB), Z0
	VPCLMULQDQ $0x00, Z0, Z1, Z5
	VPCLMULQDQ $0x11, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z5, Z1, Z2
	VPCLMULQDQ $0x00, Z0, Z2, Z5
	VPCLMULQDQ $0x11, Z0, Z2, Z2
	VPTERNLOGD $0x96, Z5, Z2, Z3
	VPCLMULQDQ $0x00, Z0, Z3, Z5
	VPCLMULQDQ $0x11, Z0, Z3, Z3
	VPTERNLOGD $0x96, Z5, Z3, Z4

	// What is left, 64 bytes at a time.
	CMPQ CX, $64
	JB   lanes
loop64:
	VMOVDQU64  0(SI), Z9
	TESTQ      DX, DX
	JZ         fold64
	VMOVDQU64  Z9, 0(DX)
	ADDQ       $64, DX

fold64:
	VPCLMULQDQ $0x00, Z0, Z4, Z5
	VPCLMULQDQ $0x11, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z9, Z5, Z4
	ADDQ       $64, SI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JAE        loop64

lanes:
	// Fold the four 128-bit lanes into the last one, 16 bytes apart.
	VEXTRACTI32X4 $1, Z4, X5
	VEXTRACTI32X4 $2, Z4, X6
	VEXTRACTI32X4 $3, Z4, X7
	VMOVDQU       fold128<>(SB), X0
	VPCLMULQDQ    $0x00, X0, X4, X8
	VPCLMULQDQ    $0x11, X0, X4, X4
	VPXOR         X8, X4, X4
	VPXOR         X5, X4, X4
	VPCLMULQDQ    $0x00, X0, X4, X8
	VPCLMULQDQ    $0x11, X0, X4, X4
	VPXOR         X8, X4, X4
	VPXOR         X6, X4, X4
	VPCLMULQDQ    $0x00, X0, X4, X8
	VPCLMULQDQ    $0x11, X0, X4, X4
	VPXOR         X8, X4, X4
	VPXOR         X7, X4, X4
	VMOVDQU       X4, (DI)
	VZEROUPPER
	RET
