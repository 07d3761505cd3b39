package virt

import (
	"encoding/xml"
	"fmt"
	"strings"
)

type domainXML struct {
	XMLName xml.Name `xml:"domain"`
	Type    string   `xml:"type,attr"`
	// XMLNSQEMU declares the namespace of QEMUArgs.
	XMLNSQEMU  string       `xml:"xmlns:qemu,attr,omitempty"`
	Name       string       `xml:"name"`
	Memory     memoryXML    `xml:"memory"`
	VCPU       int          `xml:"vcpu"`
	OS         osXML        `xml:"os"`
	Features   *featuresXML `xml:"features,omitempty"`
	CPU        *cpuXML      `xml:"cpu,omitempty"`
	OnPoweroff string       `xml:"on_poweroff"`
	OnReboot   string       `xml:"on_reboot"`
	OnCrash    string       `xml:"on_crash"`
	Devices    devicesXML   `xml:"devices"`
	QEMUArgs   *qemuArgsXML `xml:"qemu:commandline,omitempty"`
}

const qemuNS = "http://libvirt.org/schemas/domain/qemu/1.0"

type qemuArgsXML struct {
	Args []qemuArgXML `xml:"qemu:arg"`
}

type qemuArgXML struct {
	Value string `xml:"value,attr"`
}

// cpuDriverArches are the guest architectures libvirt's CPU driver knows
// (libvirt 9: x86, ppc64, s390, arm). For any other, libvirt refuses a
// domain with a <cpu> element ("architecture is not supported by CPU
// driver"), so the model goes straight to QEMU instead.
var cpuDriverArches = map[string]bool{
	"i686": true, "x86_64": true, "ppc64": true, "ppc64le": true, "s390x": true,
	"armv6l": true, "armv7l": true, "armv7b": true, "aarch64": true,
}

type featuresXML struct {
	ACPI *struct{} `xml:"acpi,omitempty"`
	APIC *struct{} `xml:"apic,omitempty"`
}

type memoryXML struct {
	Unit  string `xml:"unit,attr"`
	Value int    `xml:",chardata"`
}

type osXML struct {
	Type    osTypeXML `xml:"type"`
	Kernel  string    `xml:"kernel"`
	Initrd  string    `xml:"initrd,omitempty"`
	Cmdline string    `xml:"cmdline,omitempty"`
}

type osTypeXML struct {
	Arch    string `xml:"arch,attr"`
	Machine string `xml:"machine,attr,omitempty"`
	Value   string `xml:",chardata"`
}

type cpuXML struct {
	Mode  string `xml:"mode,attr"`
	Model string `xml:"model,omitempty"`
}

type devicesXML struct {
	Emulator    string          `xml:"emulator"`
	Disks       []diskXML       `xml:"disk"`
	Interfaces  []interfaceXML  `xml:"interface"`
	Serials     []serialXML     `xml:"serial"`
	Channels    []channelXML    `xml:"channel"`
	Controllers []controllerXML `xml:"controller"`
	Memballoon  modelXML        `xml:"memballoon"`
}

type diskXML struct {
	Type     string      `xml:"type,attr"`
	Device   string      `xml:"device,attr"`
	Driver   driverXML   `xml:"driver"`
	Source   fileXML     `xml:"source"`
	Target   targetXML   `xml:"target"`
	ReadOnly *struct{}   `xml:"readonly,omitempty"`
	Address  *addressXML `xml:"address,omitempty"`
}

type addressXML struct {
	Type     string `xml:"type,attr"`
	Domain   string `xml:"domain,attr,omitempty"`
	Bus      string `xml:"bus,attr,omitempty"`
	Slot     string `xml:"slot,attr,omitempty"`
	Function string `xml:"function,attr,omitempty"`
}

// deviceAddresses places virtio devices where the guest's kernel can find
// them; nil leaves the choice to libvirt.
type deviceAddresses interface {
	take(virtio bool) *addressXML
}

// deviceAddressesFor is nil (libvirt's choice) except on boards where that
// choice leaves devices unreachable.
func deviceAddressesFor(arch, machine string) deviceAddresses {
	switch {
	case machine == "malta":
		return &pciSlots{next: 18}
	case arch == "armv7l" && (machine == "virt" || strings.HasPrefix(machine, "virt-")):
		return virtioMMIO{}
	}
	return nil
}

// pciSlots hands out PCI slots on machines whose firmware routes
// interrupts to a few slots only: Malta wires INTA-D to slots 18-21 and
// leaves devices anywhere else without an interrupt.
type pciSlots struct{ next int }

func (p *pciSlots) take(bool) *addressXML {
	a := &addressXML{Type: "pci", Domain: "0x0000", Bus: "0x00", Slot: fmt.Sprintf("0x%02x", p.next), Function: "0x0"}
	p.next++
	return a
}

// virtioMMIO keeps 32-bit ARM guests off PCI. libvirt puts virtio devices
// on PCIe, and QEMU's virt board maps the PCIe ECAM above 4 GiB (at
// 0x4010000000) for any CPU with LPAE; a kernel without LPAE (Debian's
// armmp) truncates the address, pci-host-generic fails to claim it, and
// the guest never sees its disk. virtio-mmio needs no host bridge.
type virtioMMIO struct{}

// A device that is not virtio stays where libvirt puts it.
func (virtioMMIO) take(virtio bool) *addressXML {
	if !virtio {
		return nil
	}
	return &addressXML{Type: "virtio-mmio"}
}

func take(a deviceAddresses, virtio bool) *addressXML {
	if a == nil {
		return nil
	}
	return a.take(virtio)
}

type driverXML struct {
	Name string `xml:"name,attr"`
	Type string `xml:"type,attr"`
}

type fileXML struct {
	File string `xml:"file,attr,omitempty"`
	Path string `xml:"path,attr,omitempty"`
}

type targetXML struct {
	Dev  string `xml:"dev,attr,omitempty"`
	Bus  string `xml:"bus,attr,omitempty"`
	Type string `xml:"type,attr,omitempty"`
	Name string `xml:"name,attr,omitempty"`
	Port *int   `xml:"port,attr,omitempty"`
}

type interfaceXML struct {
	Type    string      `xml:"type,attr"`
	MAC     *macXML     `xml:"mac,omitempty"`
	Source  sourceNet   `xml:"source"`
	Model   modelXML    `xml:"model"`
	Address *addressXML `xml:"address,omitempty"`
}

type macXML struct {
	Address string `xml:"address,attr"`
}

type sourceNet struct {
	Network string `xml:"network,attr,omitempty"`
	Bridge  string `xml:"bridge,attr,omitempty"`
}

type modelXML struct {
	Type  string `xml:"type,attr,omitempty"`
	Model string `xml:"model,attr,omitempty"`
}

type serialXML struct {
	Type   string    `xml:"type,attr"`
	Source fileXML   `xml:"source"`
	Target targetXML `xml:"target"`
}

type channelXML struct {
	Type   string    `xml:"type,attr"`
	Target targetXML `xml:"target"`
}

type controllerXML struct {
	Type    string      `xml:"type,attr"`
	Index   *int        `xml:"index,attr,omitempty"`
	Model   string      `xml:"model,attr,omitempty"`
	Address *addressXML `xml:"address,omitempty"`
}

// DomainXML renders a transient domain booted from cfg's kernel. Nothing
// the guest does not need is added (no graphics, USB or balloon), which
// keeps TCG boots short.
func DomainXML(cfg DomainConfig) (string, error) {
	if cfg.Name == "" || cfg.Kernel == "" || cfg.Arch == "" {
		return "", fmt.Errorf("domain needs a name, a kernel and an architecture")
	}
	d := domainXML{
		Type:       "qemu",
		Name:       cfg.Name,
		Memory:     memoryXML{Unit: "MiB", Value: max(cfg.MemoryMiB, 128)},
		VCPU:       max(cfg.VCPUs, 1),
		OS:         osXML{Type: osTypeXML{Arch: cfg.Arch, Machine: cfg.Machine, Value: "hvm"}, Kernel: cfg.Kernel, Initrd: cfg.Initrd, Cmdline: cfg.Cmdline},
		OnPoweroff: "destroy", OnReboot: "destroy", OnCrash: "destroy",
		Devices: devicesXML{
			Emulator:   cfg.Emulator,
			Memballoon: modelXML{Model: "none"},
			Channels:   []channelXML{{Type: "unix", Target: targetXML{Type: "virtio", Name: "org.qemu.guest_agent.0"}}},
		},
	}
	if cfg.Accel == KVM {
		d.Type = "kvm"
		d.CPU = &cpuXML{Mode: "host-passthrough"}
	} else if cfg.CPU != "" && cpuDriverArches[cfg.Arch] {
		d.CPU = &cpuXML{Mode: "custom", Model: cfg.CPU}
	} else if cfg.CPU != "" {
		d.XMLNSQEMU = qemuNS
		d.QEMUArgs = &qemuArgsXML{Args: []qemuArgXML{{Value: "-cpu"}, {Value: cfg.CPU}}}
	}
	if cfg.Arch == "x86_64" || cfg.Arch == "i686" {
		// Without ACPI (libvirt's default) the kernel probes PCI and
		// interrupts the slow way: seconds under TCG.
		d.Features = &featuresXML{ACPI: &struct{}{}, APIC: &struct{}{}}
	}
	slots := deviceAddressesFor(cfg.Arch, cfg.Machine)
	zero := 0
	d.Devices.Controllers = append(d.Devices.Controllers, controllerXML{Type: "usb", Model: "none"},
		controllerXML{Type: "virtio-serial", Index: &zero, Address: take(slots, true)})
	for i, disk := range cfg.Disks {
		bus := disk.Bus
		if bus == "" {
			bus = "virtio"
		}
		prefix := map[string]string{"virtio": "vd", "scsi": "sd", "ide": "hd", "sata": "sd"}[bus]
		if prefix == "" {
			return "", fmt.Errorf("disk %s: unknown bus %q", disk.Path, bus)
		}
		format := disk.Format
		if format == "" {
			format = "qcow2"
		}
		x := diskXML{Type: "file", Device: "disk", Driver: driverXML{Name: "qemu", Type: format},
			Source: fileXML{File: disk.Path}, Target: targetXML{Dev: prefix + string(rune('a'+i)), Bus: bus}}
		if disk.ReadOnly {
			x.ReadOnly = &struct{}{}
		}
		if bus == "virtio" {
			x.Address = take(slots, true)
		}
		d.Devices.Disks = append(d.Devices.Disks, x)
	}
	for _, n := range cfg.NICs {
		x := interfaceXML{Model: modelXML{Type: n.Model}}
		if x.Model.Type == "" {
			x.Model.Type = "virtio"
		}
		switch {
		case n.Network != "":
			x.Type, x.Source.Network = "network", n.Network
		case n.Bridge != "":
			x.Type, x.Source.Bridge = "bridge", n.Bridge
		default:
			return "", fmt.Errorf("interface needs a network or a bridge")
		}
		if n.MAC != "" {
			x.MAC = &macXML{Address: n.MAC}
		}
		x.Address = take(slots, x.Model.Type == "virtio")
		d.Devices.Interfaces = append(d.Devices.Interfaces, x)
	}
	if cfg.ConsoleLog != "" {
		port := 0
		d.Devices.Serials = append(d.Devices.Serials, serialXML{Type: "file", Source: fileXML{Path: cfg.ConsoleLog}, Target: targetXML{Port: &port}})
	}
	b, err := xml.MarshalIndent(d, "", "  ")
	if err != nil {
		return "", err
	}
	return string(b), nil
}
