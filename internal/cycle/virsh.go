//go:build !cgo

package cycle

import (
	"context"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// LibvirtGuest, in a build without cgo, goes through virsh; the cgo build
// (libvirt.go) is the fast one.
func LibvirtGuest(ctx context.Context, l *records.SandboxLease) (Guest, error) {
	return VirshGuest(ctx, l)
}
