package fault_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func TestCode(t *testing.T) {
	child := exec.Command("sh", "-c", "exit 3").Run()
	var ee *exec.ExitError
	if !errors.As(child, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("sh -c 'exit 3': %v", child)
	}
	_, bad := records.NewReader(strings.NewReader("{\n"), "stdin").Record()
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, fault.ExitOK},
		{"plain", errors.New("x"), fault.ExitFailure},
		{"data", fault.DataErr(errors.New("x")), fault.ExitDataErr},
		{"wrapped", fmt.Errorf("lease L: %w", fault.TempFail(errors.New("busy"))), fault.ExitTempFail},
		{"outermost class wins", fault.Usage(fmt.Errorf("a: %w", fault.Unavailable(errors.New("x")))), fault.ExitUsage},
		{"errorf", fault.Errorf(fault.ExitUnavailable, "no %s", "virsh"), fault.ExitUnavailable},
		// A malformed record is bad data wherever it is returned from.
		{"line error", fmt.Errorf("reading: %w", bad), fault.ExitDataErr},
		// A child's exit status is not this program's class.
		{"a child's exit", child, fault.ExitFailure},
	} {
		if got := fault.Code(tc.err); got != tc.want {
			t.Errorf("%s: Code(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
	if fault.DataErr(nil) != nil {
		t.Error("DataErr(nil) is not nil")
	}
}

func TestBatch(t *testing.T) {
	var b fault.Batch
	b.Add(nil)
	if b.Err() != nil || b.Failed() != 0 {
		t.Fatalf("empty batch: %v", b.Err())
	}
	b.Add(fault.DataErr(errors.New("first")))
	b.Add(fault.TempFail(errors.New("second")))
	err := b.Err()
	if fault.Code(err) != fault.ExitDataErr || b.Failed() != 2 || !fault.Reported(err) || err.Error() != "2 input(s) failed" {
		t.Fatalf("batch: %v (exit %d, %d failed, reported %v)", err, fault.Code(err), b.Failed(), fault.Reported(err))
	}
	if fault.Reported(fault.DataErr(errors.New("x"))) {
		t.Error("a single error counts as reported")
	}
}
