package platform_test

import (
	"slices"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/platform"
)

// TestExcludedMatchesTheSpec keeps UserTarget.Excluded in step with the
// emulators the amd64 image spec leaves out: a plan must not call a sample
// runnable under an emulator no image has, nor refuse one that it has.
func TestExcludedMatchesTheSpec(t *testing.T) {
	ss, err := image.LoadSpecs("")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ss.Get("debian-bookworm-" + platform.UserHost)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spec.Packages, "qemu-user-static") {
		t.Fatalf("%s does not install qemu-user-static", spec.ID)
	}
	for _, u := range platform.UserTargets() {
		excluded := slices.Contains(spec.Hardening.Exclude, "/usr/bin/"+u.Emulator())
		if u.NoBinfmt == "" && excluded != u.Excluded {
			t.Errorf("%s: spec %s excludes it: %v; catalogue Excluded: %v", u.Name, spec.ID, excluded, u.Excluded)
		}
	}
}
