// Package fault holds the exit-code classes of talkbox(7) and the mapping of
// an error to its code. It imports nothing of the project, so that domain
// packages can say what kind of failure an error is without knowing about
// the command line; internal/cli turns the class into the process's exit code.
package fault

import (
	"errors"
	"fmt"
)

// Exit codes, documented in talkbox(7).
const (
	ExitOK          = 0
	ExitFailure     = 1
	ExitUsage       = 2
	ExitDataErr     = 65 // bad input data (malformed record, truncated file)
	ExitUnavailable = 69 // missing dependency or service
	ExitTempFail    = 75 // retry later (pool exhausted, lock busy)
)

// Error carries an exit code with the message.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Coder is an error type that knows its own class (records.LineError: bad
// data), so that it needs no wrapping. The method is not named ExitCode so
// that *exec.ExitError, whose ExitCode is the child's, is not one.
type Coder interface {
	error
	FaultCode() int
}

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Err: err}
}

// DataErr marks err as bad input data (exit 65).
func DataErr(err error) error { return withCode(ExitDataErr, err) }

// Unavailable marks err as a missing dependency or service (exit 69).
func Unavailable(err error) error { return withCode(ExitUnavailable, err) }

// TempFail marks err as worth retrying later (exit 75).
func TempFail(err error) error { return withCode(ExitTempFail, err) }

// Usage marks err as a usage error (exit 2).
func Usage(err error) error { return withCode(ExitUsage, err) }

// Failure marks err as a plain failure (exit 1).
func Failure(err error) error { return withCode(ExitFailure, err) }

// Errorf is fmt.Errorf with an exit code.
func Errorf(code int, format string, a ...any) error {
	return withCode(code, fmt.Errorf(format, a...))
}

// Code maps an error to the documented exit code: the outermost class given
// with Error (or a Coder's), else 1.
func Code(err error) int {
	if err == nil {
		return ExitOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var c Coder
	if errors.As(err, &c) {
		return c.FaultCode()
	}
	return ExitFailure
}

// Batch collects per-item errors so that a batch keeps going after one bad
// input; the exit code is that of the first failure.
type Batch struct {
	first error
	count int
}

// Add records a failure (nil is ignored).
func (b *Batch) Add(err error) {
	if err == nil {
		return
	}
	if b.first == nil {
		b.first = err
	}
	b.count++
}

// Failed is the number of failures seen.
func (b *Batch) Failed() int { return b.count }

// Err returns an error whose exit code is the first failure's, or nil. The
// individual failures have already been reported, so its text is a summary
// (Reported).
func (b *Batch) Err() error {
	if b.first == nil {
		return nil
	}
	return &Error{Code: Code(b.first), Err: &reported{fmt.Errorf("%d input(s) failed", b.count)}}
}

// reported marks an error whose details were already printed.
type reported struct{ error }

func (r *reported) Unwrap() error { return r.error }

// Reported tells whether err is a summary of failures already reported one
// by one (Batch.Err), which a command need not print again.
func Reported(err error) bool {
	var r *reported
	return errors.As(err, &r)
}
