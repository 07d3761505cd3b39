package capture

import (
	"errors"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
)

// Fault gives an error of this package, or of the lab and firewall under
// it, its talkbox(7) class: bad input is 65, a busy or full disk 75, a
// missing tool 69, a lab asked to change under its feet 2.
func Fault(err error) error {
	if err == nil {
		return nil
	}
	var ie *InputError
	var inv *firewall.InvalidError
	var be *BusyError
	var me *netlab.MissingError
	var ce *netlab.ConfigChangedError
	switch {
	case errors.Is(err, diskspace.ErrLow):
		return fault.TempFail(err)
	case errors.As(err, &ce):
		return fault.Usage(err)
	case errors.As(err, &ie), errors.As(err, &inv):
		return fault.DataErr(err)
	case errors.As(err, &be):
		return fault.TempFail(err)
	case errors.As(err, &me):
		return fault.Unavailable(err)
	case errors.Is(err, errNotRunning):
		return fault.Failure(err)
	}
	return err
}
