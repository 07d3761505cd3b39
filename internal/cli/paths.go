package cli

import (
	"os"
	"path/filepath"
	"strings"
)

// defaultStateDir is the state directory when neither --state nor TB_STATE
// is given: /var/lib/talkbox for root, $XDG_STATE_HOME/talkbox otherwise.
func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/talkbox"
	}
	if x := os.Getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "talkbox")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "talkbox")
	}
	return filepath.Join(os.TempDir(), "talkbox-state")
}

// ConfigDir is the directory of the user's files of one sort ("profiles",
// "specs") when no flag names it: /etc/talkbox/NAME as root,
// $XDG_CONFIG_HOME/talkbox/NAME (default ~/.config) otherwise.
func ConfigDir(name string) string {
	if os.Geteuid() == 0 {
		return filepath.Join("/etc/talkbox", name)
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "talkbox", name)
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".config", "talkbox", name)
}

// absPath is what kong's "path" type made of --state before it could be a
// URL: ~ expanded, made absolute.
func absPath(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			p = filepath.Join(home, p[1:])
		}
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
