package virt

import (
	"context"
	"errors"
	"fmt"

	"libvirt.org/go/libvirt"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
)

// DefaultURI is the system libvirtd.
const DefaultURI = "qemu:///system"

// Libvirt is the Hypervisor over a libvirtd connection.
type Libvirt struct {
	conn *libvirt.Connect
	uri  string
}

var _ Hypervisor = (*Libvirt)(nil)

// Connect opens a libvirt connection. When libvirtd is not there the error
// exits 69 and says how to start it.
func Connect(uri string) (*Libvirt, error) {
	if uri == "" {
		uri = DefaultURI
	}
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, fault.Unavailable(fmt.Errorf("cannot connect to libvirt at %s (%s); is libvirtd running? start it with: libvirtd -d (and virtlogd -d); package libvirt-daemon-system", uri, message(err)))
	}
	return &Libvirt{conn: conn, uri: uri}, nil
}

// message is libvirt's own text without the Go wrapper's codes.
func message(err error) string {
	var le libvirt.Error
	if errors.As(err, &le) {
		return le.Message
	}
	return err.Error()
}

func code(err error) libvirt.ErrorNumber {
	var le libvirt.Error
	if errors.As(err, &le) {
		return le.Code
	}
	return -1
}

// Close releases the connection.
func (l *Libvirt) Close() error {
	_, err := l.conn.Close()
	return err
}

// Start creates a transient domain from cfg and boots it.
func (l *Libvirt) Start(ctx context.Context, cfg DomainConfig) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	x, err := DomainXML(cfg)
	if err != nil {
		return err
	}
	d, err := l.conn.DomainCreateXML(x, libvirt.DOMAIN_NONE)
	if err != nil {
		return fmt.Errorf("starting guest %s: %s", cfg.Name, message(err))
	}
	d.Free()
	return nil
}

// Destroy stops a domain at once; a missing domain is fine.
func (l *Libvirt) Destroy(ctx context.Context, name string) error {
	d, err := l.conn.LookupDomainByName(name)
	if code(err) == libvirt.ERR_NO_DOMAIN {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up guest %s: %s", name, message(err))
	}
	defer d.Free()
	if err := d.Destroy(); err != nil && code(err) != libvirt.ERR_OPERATION_INVALID && code(err) != libvirt.ERR_NO_DOMAIN {
		return fmt.Errorf("destroying guest %s: %s", name, message(err))
	}
	return nil
}

// AgentCommand sends cmd to the domain's guest agent: the libvirt transport
// of guestagent.
func (l *Libvirt) AgentCommand(ctx context.Context, name, cmd string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	d, err := l.conn.LookupDomainByName(name)
	if code(err) == libvirt.ERR_NO_DOMAIN {
		return "", fmt.Errorf("%s: %w", name, guestagent.ErrGone)
	}
	if err != nil {
		return "", fmt.Errorf("guest %s: %s", name, message(err))
	}
	defer d.Free()
	out, err := d.QemuAgentCommand(cmd, guestagent.CommandTimeout, 0)
	switch code(err) {
	case -1:
		if err != nil {
			return "", err
		}
		return out, nil
	case libvirt.ERR_AGENT_UNRESPONSIVE, libvirt.ERR_AGENT_COMMAND_TIMEOUT:
		return "", fmt.Errorf("%w: %s", guestagent.ErrNotReady, message(err))
	case libvirt.ERR_NO_DOMAIN, libvirt.ERR_OPERATION_INVALID:
		if active, aerr := d.IsActive(); aerr != nil || !active {
			return "", fmt.Errorf("%s: %w", name, guestagent.ErrGone)
		}
	}
	return "", fmt.Errorf("guest %s: %s", name, message(err))
}

// EnsureNetwork creates the isolated network as a Linux bridge with no
// uplink. libvirt's own isolated networks need dnsmasq state directories and
// firewall rules that not every host has; a bare bridge needs neither, and
// without a host address on it a guest has no route to anything at all.
func (l *Libvirt) EnsureNetwork(ctx context.Context, n NetworkConfig) error {
	return ensureBridge(ctx, n)
}
