package lease

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// glibcLoaders are the dynamic loaders Debian images of each platform have.
var glibcLoaders = map[string]string{
	"amd64": "/lib64/ld-linux-x86-64.so.2", "i386": "/lib/ld-linux.so.2", "arm64": "/lib/ld-linux-aarch64.so.1",
	"armhf": "/lib/ld-linux-armhf.so.3", "armel": "/lib/ld-linux.so.3", "mipsel": "/lib/ld.so.1", "mips64el": "/lib64/ld.so.1",
	"ppc64el": "/lib64/ld64.so.2", "s390x": "/lib/ld64.so.1",
}

// debianInterpreters are script interpreters every Debian image has.
var debianInterpreters = []string{"/bin/sh", "/bin/bash", "/bin/dash", "/usr/bin/sh", "/usr/bin/bash", "/usr/bin/env", "/usr/bin/perl"}

// missingFeature returns the first plan feature an image lacks.
func missingFeature(img *records.SandboxImage, features []string) string {
	for _, f := range features {
		switch {
		case f == "static":
		case strings.HasPrefix(f, "interpreter:"):
			in := strings.TrimPrefix(f, "interpreter:")
			if in != glibcLoaders[img.Platform] && !slices.Contains(debianInterpreters, in) {
				return f
			}
		case strings.HasPrefix(f, "qemu-user:"):
			// The guest's binfmt_misc hands the sample to this emulator;
			// without it the exec fails with ENOEXEC.
			if !slices.Contains(img.UserEmulators, strings.TrimPrefix(f, "qemu-user:")) {
				return f
			}
		default:
			return f
		}
	}
	return ""
}

// defaultABIs are the userland ABIs of the platforms that have several,
// for image records written before images recorded their ABI.
var defaultABIs = map[string]string{
	"armhf": "eabi5-hf", "armel": "eabi5-sf", "mipsel": "o32", "mips64el": "n64", "ppc64el": "elfv2",
}

// abiMismatch says why an image's userland cannot host the plan's sample,
// or "". Only a dynamic sample run natively links against the image's
// libraries: a static one needs only the platform's kernel (the planner
// already maps static soft-float ARM to armhf for that), and an emulated
// one runs under qemu-user with no guest library at all.
func abiMismatch(img *records.SandboxImage, p *records.Plan) string {
	need, have := p.Image.ABI, img.ABI
	if have == "" {
		have = defaultABIs[img.Platform]
	}
	if need == "" || have == "" || p.Emulation != nil || slices.Contains(p.Image.Features, "static") || abiCompatible(need, have) {
		return ""
	}
	return fmt.Sprintf("%s has abi %s, the plan needs %s", img.ID, have, need)
}

// abiCompatible reports whether a binary of ABI need runs on libraries of
// ABI have. For ARM the float ABI (-hf, -sf) decides which libraries a
// binary links against; a name without one (float unknown) fits either.
func abiCompatible(need, have string) bool {
	if need == have {
		return true
	}
	if strings.HasPrefix(need, "eabi") && strings.HasPrefix(have, "eabi") {
		_, nf, _ := strings.Cut(need, "-")
		_, hf, _ := strings.Cut(have, "-")
		return nf == "" || nf == hf
	}
	return false
}

// imageMismatch says why an image cannot run the plan's sample, or "".
func imageMismatch(img *records.SandboxImage, p *records.Plan) string {
	needs := p.Image
	if needs.Platform != "" && img.Platform != needs.Platform {
		return fmt.Sprintf("%s is %s, the plan needs %s", img.ID, img.Platform, needs.Platform)
	}
	if w := abiMismatch(img, p); w != "" {
		return w
	}
	if f := missingFeature(img, needs.Features); f != "" {
		return fmt.Sprintf("%s lacks %s", img.ID, f)
	}
	return ""
}

// chooseImage finds the best image for a plan: a forced image, then the
// plan's preferred images in order (SPEC@VERSION pins a version), then the
// newest active image of the plan's platform.
func (m *Manager) chooseImage(r *Request) (*records.SandboxImage, error) {
	p := r.Plan
	needs := p.Image
	refs := needs.Preferred
	if r.Image != "" {
		refs = []string{r.Image}
	}
	var why []string
	for _, ref := range refs {
		img, err := image.Resolve(m.St, ref)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: no such image", ref))
			if strings.Contains(ref, "@") || r.Image != "" {
				return nil, m.noImage(p, fmt.Sprintf("pinned image %s is not published", ref))
			}
			continue
		}
		w := imageMismatch(img, p)
		if w == "" {
			w = notHere(img)
		}
		if w != "" {
			if strings.Contains(ref, "@") || r.Image != "" {
				return nil, m.noImage(p, w)
			}
			why = append(why, w)
			continue
		}
		return img, nil
	}
	imgs, err := image.Images(m.St, "")
	if err != nil {
		return nil, err
	}
	var best *records.SandboxImage
	for _, img := range imgs {
		if img.Status != records.ImageActive {
			continue
		}
		w := imageMismatch(img, p)
		if w == "" {
			w = notHere(img)
		}
		if w != "" {
			why = append(why, w)
			continue
		}
		if best == nil || img.PublishedAt.After(best.PublishedAt) {
			best = img
		}
	}
	if best == nil {
		return nil, m.noImage(p, strings.Join(why, "; "))
	}
	return best, nil
}

// notHere says why an image cannot boot on this host, or "": image records
// are a fleet's, but each host has only the files of the images it built
// or installed.
func notHere(img *records.SandboxImage) string {
	if err := image.Present(img); err != nil {
		return err.Error() + " (not on this host)"
	}
	return ""
}

// noImage says what the plan needs, so that the planner can change it or
// an image can be built.
func (m *Manager) noImage(p *records.Plan, why string) error {
	n := p.Image
	need := "platform " + orAny(n.Platform)
	if n.ABI != "" {
		need += ", abi " + n.ABI
	}
	if len(n.Features) > 0 {
		need += ", features " + strings.Join(n.Features, " ")
	}
	hint := "build one with: tb-build build debian-bookworm-" + n.Platform
	if ss, err := image.LoadSpecs(""); err == nil {
		if _, err := ss.Get("debian-bookworm-" + n.Platform); err != nil {
			hint = "no image spec exists for it: re-plan the sample with another --platform, or add a spec"
		}
	}
	if n.Platform == "" {
		hint = "build one with: tb-build build SPEC (see tb-build specs)"
	}
	if e := p.Emulation; e != nil {
		hint = fmt.Sprintf("it runs the %s sample under %s: build an image for %s whose user_emulators include %s (tb-build build debian-bookworm-%s, with qemu-user-static)",
			e.Platform, e.Emulator, n.Platform, e.Target, n.Platform)
	}
	msg := fmt.Sprintf("no image matches plan %s: it needs %s; %s", orAny(p.ID), need, hint)
	if why != "" {
		msg += " (" + why + ")"
	}
	return fault.Failure(errors.New(msg))
}

func orAny(s string) string {
	if s == "" {
		return "any"
	}
	return s
}

// Decide is an acquire's choices without their effects.
