package lease

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/yarascan"
)

// ArtifactMemoryDump is the type of a guest memory dump artifact: an ELF
// core of the guest's physical memory, zstd-compressed.
const ArtifactMemoryDump = "memory-dump"

// Dump writes a running lease's memory to the blob store as an artifact
// (of cycle, if given). The guest is paused while libvirt writes the dump
// into the lease's directory, and runs on; the dump is compressed into the
// blob store and the uncompressed file removed. The analyst's YARA rules
// (yaraDirs, the plan's of the cycle's sample, and /etc/talkbox/yara) run
// over the uncompressed dump first: a yara observable of the lease (and
// cycle) per matching rule.
func (m *Manager) Dump(ctx context.Context, id, cycle string, yaraDirs ...string) (*records.Artifact, error) {
	l, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if cycle != "" {
		var c records.Cycle
		var pl records.Plan
		if m.St.Get(cycle, &c) == nil && m.St.Get(c.Plan, &pl) == nil {
			yaraDirs = append(slices.Clip(yaraDirs), pl.Yara...)
		}
	}
	rules, err := yarascan.Compile(ctx, yarascan.Dirs(yaraDirs...))
	if err != nil {
		return nil, err
	}
	defer rules.Close()
	if l.State != records.LeaseBusy && l.State != records.LeaseIdle {
		return nil, fault.Failure(fmt.Errorf("lease %s is %s; only a running lease's memory can be dumped", id, l.State))
	}
	c, err := m.connFor(l)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	dir := filepath.Join(l.Dir, "dump")
	if err := m.mkdirReachable(dir); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	core := filepath.Join(dir, "memory.elf")
	if err := c.DumpMemory(ctx, l.VMName, core); err != nil {
		return nil, err
	}
	rawSHA, rawSize, err := files.SHA256(core)
	if err != nil {
		return nil, err
	}
	packed := filepath.Join(dir, "memory.elf.zst")
	if err := compressFile(core, packed); err != nil {
		return nil, err
	}
	f, err := os.Open(packed)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := m.St.PutBlob(ctx, f)
	if err != nil {
		return nil, err
	}
	a := &records.Artifact{Lease: l.ID, Cycle: cycle, Type: ArtifactMemoryDump, URI: b.URI(), SHA256: b.SHA256, Size: b.Size,
		ContentType: "application/x-core+zstd", ParserStatus: "none",
		Metadata: map[string]any{"format": "elf", "raw_sha256": rawSHA, "raw_size": rawSize,
			"memory_mib": l.Limits.MemoryMiB, "took": time.Since(start).Round(time.Millisecond).String()}}
	records.Init(a, records.KindArtifact, m.St.Now())
	if err := m.St.Create(ctx, a); err != nil {
		return nil, err
	}
	ms, err := rules.Scan(ctx, core)
	if err != nil {
		return a, fmt.Errorf("scanning the memory dump %s: %w", a.ID, err)
	}
	obs, err := yarascan.Record(ctx, m.St, yarascan.File{Target: yarascan.TargetMemory, SHA256: rawSHA, Artifact: a.ID, Lease: l.ID, Cycle: cycle, Input: ArtifactMemoryDump}, ms)
	for _, o := range obs {
		m.Out.Log.Info("yara rule matches the guest's memory", "lease", l.ID, "artifact", a.ID, "rule", o.Value)
	}
	return a, err
}

func compressFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	enc, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2))
	if err != nil {
		out.Close()
		return err
	}
	_, err = io.Copy(enc, in)
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
