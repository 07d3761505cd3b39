package virt

import (
	"context"
	"fmt"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
)

// What tb-lease needs beyond Hypervisor: domains from raw XML, their
// inventory, save and restore with memory, and the host's capacity.

// URI is the connection's libvirt URI.
func (l *Libvirt) URI() string { return l.uri }

// CreatePaused creates a transient domain from a complete domain XML with
// its vCPUs paused: its devices (the tap) exist, and the guest has not run
// an instruction, until Resume.
func (l *Libvirt) CreatePaused(ctx context.Context, domXML string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := l.conn.DomainCreateXML(domXML, libvirt.DOMAIN_START_PAUSED)
	if err != nil {
		return fmt.Errorf("starting guest: %s", message(err))
	}
	d.Free()
	return nil
}

// Resume runs a paused domain's vCPUs.
func (l *Libvirt) Resume(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := l.conn.LookupDomainByName(name)
	if err != nil {
		return fmt.Errorf("looking up guest %s: %s", name, message(err))
	}
	defer d.Free()
	if err := d.Resume(); err != nil {
		return fmt.Errorf("resuming guest %s: %s", name, message(err))
	}
	return nil
}

// DomainStatus is one domain as libvirt sees it.
type DomainStatus struct {
	Name      string
	Active    bool
	State     string
	MemoryKiB uint64
	VCPUs     uint
	CPUTime   time.Duration
	// Description is the domain's <description>, where tb-lease records
	// which lease and state directory a domain belongs to.
	Description string
}

var domStateNames = map[libvirt.DomainState]string{
	libvirt.DOMAIN_NOSTATE: "nostate", libvirt.DOMAIN_RUNNING: "running", libvirt.DOMAIN_BLOCKED: "blocked",
	libvirt.DOMAIN_PAUSED: "paused", libvirt.DOMAIN_SHUTDOWN: "shutdown", libvirt.DOMAIN_SHUTOFF: "shutoff",
	libvirt.DOMAIN_CRASHED: "crashed", libvirt.DOMAIN_PMSUSPENDED: "pmsuspended",
}

func domStatusOf(d *libvirt.Domain) (DomainStatus, error) {
	var s DomainStatus
	var err error
	if s.Name, err = d.GetName(); err != nil {
		return s, fmt.Errorf("domain name: %s", message(err))
	}
	info, err := d.GetInfo()
	if err != nil {
		return s, fmt.Errorf("domain %s: %s", s.Name, message(err))
	}
	s.State = domStateNames[info.State]
	s.Active = info.State != libvirt.DOMAIN_SHUTOFF
	s.MemoryKiB, s.VCPUs, s.CPUTime = info.Memory, info.NrVirtCpu, time.Duration(info.CpuTime)
	if desc, err := d.GetMetadata(libvirt.DOMAIN_METADATA_DESCRIPTION, "", libvirt.DOMAIN_AFFECT_LIVE); err == nil {
		s.Description = desc
	}
	return s, nil
}

// Domains lists every domain of the connection.
func (l *Libvirt) Domains(ctx context.Context) ([]DomainStatus, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	doms, err := l.conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains on %s: %s", l.uri, message(err))
	}
	var out []DomainStatus
	for i := range doms {
		s, err := domStatusOf(&doms[i])
		doms[i].Free()
		if err != nil {
			continue // gone while listing
		}
		out = append(out, s)
	}
	return out, nil
}

// DomainStatusOf returns one domain's status; ok is false if there is none.
func (l *Libvirt) DomainStatusOf(name string) (s DomainStatus, ok bool, err error) {
	d, err := l.conn.LookupDomainByName(name)
	if code(err) == libvirt.ERR_NO_DOMAIN {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("looking up guest %s: %s", name, message(err))
	}
	defer d.Free()
	s, err = domStatusOf(d)
	if code(err) == libvirt.ERR_NO_DOMAIN {
		return s, false, nil
	}
	return s, err == nil, err
}

// SaveDomain writes a running domain's memory and device state to path;
// the domain stops (a transient one is gone). The disks are flushed.
func (l *Libvirt) SaveDomain(ctx context.Context, name, path string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := l.conn.LookupDomainByName(name)
	if err != nil {
		return fmt.Errorf("looking up guest %s: %s", name, message(err))
	}
	defer d.Free()
	if err := d.SaveFlags(path, "", libvirt.DOMAIN_SAVE_RUNNING); err != nil {
		return fmt.Errorf("saving guest %s: %s", name, message(err))
	}
	return nil
}

// DumpMemory writes a running domain's memory to path as an ELF core
// (QEMU's dump-guest-memory); the guest is paused while it is written and
// then runs on.
func (l *Libvirt) DumpMemory(ctx context.Context, name, path string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := l.conn.LookupDomainByName(name)
	if err != nil {
		return fmt.Errorf("looking up guest %s: %s", name, message(err))
	}
	defer d.Free()
	if err := d.CoreDumpWithFormat(path, libvirt.DOMAIN_CORE_DUMP_FORMAT_RAW, libvirt.DUMP_MEMORY_ONLY); err != nil {
		return fmt.Errorf("dumping the memory of guest %s: %s", name, message(err))
	}
	return nil
}

// RestorePaused starts a domain from a saved state, paused until Resume,
// with domXML (when not empty) replacing the saved definition: a new name,
// disk or MAC for a copy of the saved guest.
func (l *Libvirt) RestorePaused(ctx context.Context, path, domXML string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.conn.DomainRestoreFlags(path, domXML, libvirt.DOMAIN_SAVE_PAUSED); err != nil {
		return fmt.Errorf("restoring %s: %s", path, message(err))
	}
	return nil
}

// SavedXML returns the domain definition inside a saved state file.
func (l *Libvirt) SavedXML(path string) (string, error) {
	x, err := l.conn.DomainSaveImageGetXMLDesc(path, libvirt.DOMAIN_SAVE_IMAGE_XML_SECURE)
	if err != nil {
		return "", fmt.Errorf("reading the definition in %s: %s", path, message(err))
	}
	return x, nil
}

// HostStatus is a host's capacity and what is left of it.
type HostStatus struct {
	URI         string `json:"connect_uri"`
	Hostname    string `json:"hostname"`
	Arch        string `json:"arch"`
	CPUs        uint   `json:"cpus"`
	MemoryMiB   uint64 `json:"memory_mib"`
	FreeMiB     uint64 `json:"free_memory_mib"`
	Domains     int    `json:"domains"`
	KVMCapable  bool   `json:"kvm_capable"`
	LibvirtVers string `json:"libvirt_version"`
}

// Host reports the host's capacity.
func (l *Libvirt) Host(ctx context.Context) (HostStatus, error) {
	h := HostStatus{URI: l.uri}
	if err := ctx.Err(); err != nil {
		return h, err
	}
	ni, err := l.conn.GetNodeInfo()
	if err != nil {
		return h, fmt.Errorf("host info of %s: %s", l.uri, message(err))
	}
	h.Arch, h.CPUs, h.MemoryMiB = ni.Model, ni.Cpus, ni.Memory/1024
	if free, err := l.conn.GetFreeMemory(); err == nil {
		h.FreeMiB = free >> 20
	}
	h.Hostname, _ = l.conn.GetHostname()
	if n, err := l.conn.NumOfDomains(); err == nil {
		h.Domains = n
	}
	if caps, err := l.conn.GetCapabilities(); err == nil {
		h.KVMCapable = strings.Contains(caps, "<domain type='kvm'")
	}
	if v, err := l.conn.GetLibVersion(); err == nil {
		h.LibvirtVers = fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
	}
	return h, nil
}
