//go:build cgo

package cycle

import (
	"context"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// LibvirtGuest connects to a lease's libvirt host (libvirt's C library,
// through cgo) and talks to its guest agent.
func LibvirtGuest(ctx context.Context, l *records.SandboxLease) (Guest, error) {
	lv, err := virt.Connect(l.ConnectURI)
	if err != nil {
		return nil, fault.Unavailable(fmt.Errorf("lease %s: %w", l.ID, err))
	}
	return agentGuest{Client: guestagent.New(lv, l.VMName), conn: lv}, nil
}
