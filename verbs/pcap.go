package verbs

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/softrnic/softrnic/internal/pcap"
)

// PacketCapture is a pcap capture that devices write every packet they send and receive
// to (DeviceConfig.Capture), as a link would carry them; see DeviceConfig.PcapFile. It is
// safe for concurrent use by several devices.
type PacketCapture struct {
	w *pcap.Writer
}

// NewPacketCapture starts a capture on w (closed by Close if it is an io.Closer) that
// stops growing at limit bytes (0: DefaultPcapLimit).
func NewPacketCapture(w io.Writer, limit int64) (*PacketCapture, error) {
	if limit <= 0 {
		limit = DefaultPcapLimit
	}
	pw, err := pcap.NewWriter(w, limit)
	if err != nil {
		return nil, fmt.Errorf("verbs: packet capture: %w", err)
	}
	return &PacketCapture{w: pw}, nil
}

// Dropped returns how many packets did not fit the capture's size limit.
func (c *PacketCapture) Dropped() uint64 { return c.w.Dropped() }

// Close flushes the capture and closes its writer. Close the devices that write to it
// first.
func (c *PacketCapture) Close() error { return c.w.Close() }

// pcapSeq numbers the captures PcapEnv makes in this process.
var pcapSeq atomic.Int64

// openPcap creates the device's packet capture, if it has one.
func openPcap(cfg DeviceConfig, addr netip.Addr) (*pcap.Writer, error) {
	file := cfg.PcapFile
	if file == "" {
		dir := os.Getenv(PcapEnv)
		if dir == "" {
			return nil, nil
		}
		file = filepath.Join(dir, fmt.Sprintf("softrnic-%s-%d-%d.pcap", addr, os.Getpid(), pcapSeq.Add(1)))
	}
	limit := cfg.PcapLimit
	if limit <= 0 {
		limit = DefaultPcapLimit
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("packet capture: %w", err)
	}
	w, err := pcap.NewWriter(f, limit)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("packet capture %s: %w", file, err)
	}
	return w, nil
}
