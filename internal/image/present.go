package image

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Present checks that an image's files are on this host, each of the size
// its record says. Image records are shared by a fleet's hosts, but each
// host has only the files of the images it built or installed.
func Present(img *records.SandboxImage) error {
	if img.Dir == "" {
		return fmt.Errorf("image %s has no directory", img.ID)
	}
	for _, f := range img.Files {
		fi, err := os.Stat(filepath.Join(img.Dir, f.Name))
		if err != nil {
			return fmt.Errorf("image %s: %w", img.ID, err)
		}
		if !fi.Mode().IsRegular() || fi.Size() != f.Size {
			return fmt.Errorf("image %s: %s is not the %d-byte file of the record", img.ID, f.Name, f.Size)
		}
	}
	for _, name := range []string{img.Boot.Kernel, img.Boot.Initrd, img.Boot.Disk} {
		if name == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(img.Dir, name)); err != nil {
			return fmt.Errorf("image %s: %w", img.ID, err)
		}
	}
	return nil
}
