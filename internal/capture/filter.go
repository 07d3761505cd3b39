package capture

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ParseBPF reads a classic BPF program in the form tcpdump -ddd prints it:
// a count, then one "code jt jf k" instruction per line. Commas may stand
// for newlines ("4,40 0 0 12,21 0 1 2048,6 0 0 262144,6 0 0 0").
func ParseBPF(text string) ([]unix.SockFilter, error) {
	text = strings.ReplaceAll(strings.TrimSpace(text), ",", "\n")
	lines := strings.Split(text, "\n")
	n, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || n <= 0 || n > 4096 {
		return nil, fmt.Errorf("bpf: first line must be the instruction count (tcpdump -ddd output)")
	}
	if len(lines)-1 != n {
		return nil, fmt.Errorf("bpf: %d instructions announced, %d given", n, len(lines)-1)
	}
	prog := make([]unix.SockFilter, 0, n)
	for i, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 4 {
			return nil, fmt.Errorf("bpf: instruction %d: want \"code jt jf k\"", i+1)
		}
		var v [4]uint64
		for j, s := range f {
			if v[j], err = strconv.ParseUint(s, 10, 32); err != nil {
				return nil, fmt.Errorf("bpf: instruction %d: %q is not a number", i+1, s)
			}
		}
		if v[1] > 255 || v[2] > 255 || v[0] > 0xffff {
			return nil, fmt.Errorf("bpf: instruction %d out of range", i+1)
		}
		prog = append(prog, unix.SockFilter{Code: uint16(v[0]), Jt: uint8(v[1]), Jf: uint8(v[2]), K: uint32(v[3])})
	}
	return prog, nil
}

// ErrNoCompiler means a filter expression was given but tcpdump, which
// compiles it, is not installed.
var ErrNoCompiler = errors.New("compiling a filter expression needs tcpdump (or give --bpf with tcpdump -ddd output)")

// CompileFilter turns a pcap-filter(7) expression into BPF for Ethernet
// frames with tcpdump -ddd, which is the only place talkbox uses libpcap.
func CompileFilter(ctx context.Context, expr string, snaplen int) ([]unix.SockFilter, error) {
	if _, err := exec.LookPath("tcpdump"); err != nil {
		return nil, ErrNoCompiler
	}
	args := []string{"-ddd", "-y", "EN10MB"}
	if snaplen > 0 {
		args = append(args, "-s", strconv.Itoa(snaplen))
	}
	out, err := exec.CommandContext(ctx, "tcpdump", append(args, expr)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("filter %q: %s", expr, strings.TrimSpace(string(out)))
	}
	return ParseBPF(string(out))
}
