package capture

import (
	"path/filepath"

	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// ControlSocket is the control socket of a capture's daemon, for a test
// that looks at the file.
func ControlSocket(st *state.Store, captureID string) string {
	return filepath.Join(controlDir(st), socketName(captureID))
}

// DialControl connects to a capture's control socket, for tests that speak
// the protocol by hand (a client that dribbles or floods).
var DialControl = dialControl
