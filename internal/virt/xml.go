package virt

import (
	"encoding/xml"
	"fmt"
)

type domainXML struct {
	XMLName    xml.Name     `xml:"domain"`
	Type       string       `xml:"type,attr"`
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
	Domain   string `xml:"domain,attr"`
	Bus      string `xml:"bus,attr"`
	Slot     string `xml:"slot,attr"`
	Function string `xml:"function,attr"`
}

// pciSlots hands out PCI slots on machines whose firmware routes
// interrupts to a few slots only: Malta wires INTA-D to slots 18-21 and
// leaves devices anywhere else without an interrupt.
type pciSlots struct{ next int }

func (p *pciSlots) take() *addressXML {
	if p == nil {
		return nil
	}
	a := &addressXML{Type: "pci", Domain: "0x0000", Bus: "0x00", Slot: fmt.Sprintf("0x%02x", p.next), Function: "0x0"}
	p.next++
	return a
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
	} else if cfg.CPU != "" {
		d.CPU = &cpuXML{Mode: "custom", Model: cfg.CPU}
	}
	if cfg.Arch == "x86_64" || cfg.Arch == "i686" {
		// Without ACPI (libvirt's default) the kernel probes PCI and
		// interrupts the slow way: seconds under TCG.
		d.Features = &featuresXML{ACPI: &struct{}{}, APIC: &struct{}{}}
	}
	var slots *pciSlots
	if cfg.Machine == "malta" {
		slots = &pciSlots{next: 18}
	}
	zero := 0
	d.Devices.Controllers = append(d.Devices.Controllers, controllerXML{Type: "usb", Model: "none"},
		controllerXML{Type: "virtio-serial", Index: &zero, Address: slots.take()})
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
			x.Address = slots.take()
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
		x.Address = slots.take()
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
