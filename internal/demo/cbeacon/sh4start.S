/* sh4start.S: entry-point shim for the static sh4 C beacon ONLY.
 *
 * Why: Debian bookworm's sh4 glibc (libc6-dev-sh4-cross 2.36, libc.a) ships a
 * miscompiled __libc_start_main.  The loop in csu/libc-start.c that skips the
 * environment to find the auxiliary vector,
 *
 *	char **evp = ev; while (*evp++ != NULL) ; auxvec = evp;
 *
 * was compiled to "bf.s <itself>; add #4,r4": no load, no test.  With T=0 on
 * entry it spins forever, so every static sh4 program hangs before main.
 * With T=1 it falls through once, leaving r4 = envp + 4.
 *
 * What: the linker is told to enter here (-Wl,-e,_tb_sh4_start) instead of at
 * glibc's _start.  We rewrite the initial stack so that the environment is
 * empty, i.e. envp[0] == NULL is immediately followed by the auxv, by moving
 * argc, argv[] and argv's NULL terminator up over the envp pointers (the
 * areas overlap, so the copy runs from the top down).  Then we set T=1 and
 * jump to glibc's unmodified _start (crt1.o), which calls __libc_start_main
 * exactly as usual.  Neither glibc's _start (mov/mov.l/jsr/nop) nor the
 * prologue of __libc_start_main up to the loop (mov/mov.l/add/shll2/sts.l)
 * changes T, so the broken loop runs once and yields envp + 4 == auxv.
 *
 * Cost: the program starts with an EMPTY ENVIRONMENT (environ[0] == NULL).
 * That is acceptable for the beacon: it never reads the environment (it
 * takes its DNS server from /etc/resolv.conf and its policy from argv).
 * argv, argc and the auxv are preserved; r4 (rtld_fini from the kernel) is
 * left untouched for _start.
 */

	.text
	.align	2
	.globl	_tb_sh4_start
	.type	_tb_sh4_start, @function
_tb_sh4_start:
	mov.l	@r15, r0	/* r0 = argc */
	shll2	r0
	mov	r15, r1
	add	#4, r1
	add	r0, r1		/* r1 = &argv[argc] (argv's NULL) */
	mov	r1, r2
1:	add	#4, r2		/* r2 walks envp[] */
	mov.l	@r2, r3
	tst	r3, r3
	bf	1b		/* until r2 = &envp[envc] (envp's NULL) */
	add	#-4, r2		/* new home of argv's NULL */
2:	mov.l	@r1, r3		/* copy argc..argv[argc], top down */
	mov.l	r3, @r2
	cmp/eq	r1, r15		/* T = (just copied argc) */
	add	#-4, r1
	bf/s	2b
	 add	#-4, r2
	add	#4, r2
	mov	r2, r15		/* r15 -> relocated argc */
	mov.l	.L_glibc_start, r1
	sett			/* T=1: see above; nothing before the loop clears it */
	jmp	@r1
	 nop
	.align	2
.L_glibc_start:
	.long	_start
	.size	_tb_sh4_start, . - _tb_sh4_start

	.section .note.GNU-stack, "", @progbits
