// Package version reports the toolkit's version and build.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the toolkit release. Every tb-* tool shares it.
const Version = "0.1.0"

// String is the --version line: tool, release, VCS revision when known, Go.
func String(tool string) string {
	rev := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && dirty {
			rev += "+dirty"
		}
	}
	if rev != "" {
		return fmt.Sprintf("%s %s (%s, %s)", tool, Version, rev, runtime.Version())
	}
	return fmt.Sprintf("%s %s (%s)", tool, Version, runtime.Version())
}
