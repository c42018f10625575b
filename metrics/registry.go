// Package metrics publishes the counters of softrnic's devices, their QPs, completion
// handlers and connection managers, and of msg communicators, with nothing but the
// standard library: as Prometheus text exposition (format 0.0.4) from an http.Handler a
// program mounts, and as JSON through expvar.
//
// A Registry holds the devices and communicators to publish. Default is published through
// expvar as "softrnic" (served at /debug/vars by expvar's handler) and served by Handler;
// a program that wants more than one set makes its own with NewRegistry (a Registry is
// both an http.Handler and an expvar.Var):
//
//	dev, _ := verbs.OpenDevice(verbs.DeviceConfig{})
//	metrics.AddDevice(dev)
//	http.Handle("/metrics", metrics.Handler())
//
// A device's QPs, completion handlers and connection manager come with it; a
// communicator brings its device. Closed devices and communicators leave the registry by
// themselves at the next read (RemoveDevice and RemoveComm take them out sooner).
//
// Reading is cheap and safe while traffic runs: each counter set is copied under its own
// short lock (the one the verbs and cm calls for it take), one at a time, and a scrape
// of a device with a thousand QPs takes a few milliseconds. docs/metrics.md lists the
// metrics.
package metrics

import (
	"cmp"
	"encoding/json"
	"expvar"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/msg"
	"github.com/softrnic/softrnic/verbs"
)

// Registry is a set of devices and communicators whose counters are published together.
// Its ServeHTTP serves them in Prometheus's text format, its String as JSON (for expvar).
// The zero value is not usable; make one with NewRegistry. Its methods may be called
// from any goroutine.
type Registry struct {
	mu      sync.Mutex
	devices map[*verbs.Device]struct{}
	comms   map[*msg.Comm]struct{}
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{devices: map[*verbs.Device]struct{}{}, comms: map[*msg.Comm]struct{}{}}
}

// Default is the registry of the package-level functions, published through expvar as
// "softrnic".
var Default = NewRegistry()

// ExpvarName is the name Default is published under through expvar.
const ExpvarName = "softrnic"

func init() {
	expvar.Publish(ExpvarName, Default)
}

// AddDevice adds dev to Default.
func AddDevice(dev *verbs.Device) { Default.AddDevice(dev) }

// RemoveDevice removes dev from Default.
func RemoveDevice(dev *verbs.Device) { Default.RemoveDevice(dev) }

// AddComm adds c to Default.
func AddComm(c *msg.Comm) { Default.AddComm(c) }

// RemoveComm removes c from Default.
func RemoveComm(c *msg.Comm) { Default.RemoveComm(c) }

// Handler returns Default as an http.Handler: mount it at /metrics.
func Handler() http.Handler { return Default }

// AddDevice publishes dev's counters, its QPs', its completion handlers' and its
// connection manager's. Adding a device twice is the same as once.
func (r *Registry) AddDevice(dev *verbs.Device) {
	r.mu.Lock()
	r.devices[dev] = struct{}{}
	r.mu.Unlock()
}

// RemoveDevice stops publishing dev (a device closed leaves by itself).
func (r *Registry) RemoveDevice(dev *verbs.Device) {
	r.mu.Lock()
	delete(r.devices, dev)
	r.mu.Unlock()
}

// AddComm publishes c's counters, and its device's as AddDevice does.
func (r *Registry) AddComm(c *msg.Comm) {
	r.mu.Lock()
	r.comms[c] = struct{}{}
	r.mu.Unlock()
}

// RemoveComm stops publishing c (and its device, unless it was added itself).
func (r *Registry) RemoveComm(c *msg.Comm) {
	r.mu.Lock()
	delete(r.comms, c)
	r.mu.Unlock()
}

// String returns the registry's counters as JSON: it makes a Registry an expvar.Var.
func (r *Registry) String() string {
	b, err := json.Marshal(r.snapshot())
	if err != nil {
		return "{}"
	}
	return string(b)
}

// snapshot is what one read of the registry found: the JSON of String, and what the
// text format is written from.
type snapshot struct {
	Devices []deviceSnapshot `json:"devices"`
	Comms   []commSnapshot   `json:"comms"`
}

type deviceSnapshot struct {
	Addr     string               `json:"addr"`
	Counters verbs.Counters       `json:"counters"`
	Handlers []verbs.HandlerStats `json:"handlers"`
	CM       cm.Counters          `json:"cm"`
	SIDR     cm.SIDRCounters      `json:"sidr"`
	QPs      []qpSnapshot         `json:"qps"`

	labels string // device="ADDR", escaped
}

type qpSnapshot struct {
	QPN      uint32         `json:"qpn"`
	Counters verbs.Counters `json:"counters"`
	// SRQ is the limit queue of a QP on an SRQ (nil for a QP with a receive queue of its
	// own).
	SRQ *verbs.LimitStats `json:"srq,omitempty"`

	labels string // device="ADDR",qpn="N"
}

type commSnapshot struct {
	Device string    `json:"device"`
	Rank   int       `json:"rank"`
	Size   int       `json:"size"`
	Stats  msg.Stats `json:"stats"`

	labels string // device="ADDR",rank="N"
}

// closed reports whether dev was closed (its port is down then).
func closed(dev *verbs.Device) bool {
	a, err := dev.QueryPort(1)
	return err != nil || a.State == verbs.PortDown
}

// members returns the registry's open devices (those added, and communicators'), sorted
// by address, and open communicators, forgetting the closed ones.
func (r *Registry) members() ([]*verbs.Device, []*msg.Comm) {
	r.mu.Lock()
	set := make(map[*verbs.Device]struct{}, len(r.devices)+len(r.comms))
	for d := range r.devices {
		set[d] = struct{}{}
	}
	comms := make([]*msg.Comm, 0, len(r.comms))
	for c := range r.comms {
		comms = append(comms, c)
		set[c.Device()] = struct{}{}
	}
	r.mu.Unlock()
	devs := slices.AppendSeq(make([]*verbs.Device, 0, len(set)), maps.Keys(set))
	slices.SortFunc(devs, func(a, b *verbs.Device) int { return a.Addr().Compare(b.Addr()) })
	var gone []*verbs.Device
	devs = slices.DeleteFunc(devs, func(d *verbs.Device) bool {
		if closed(d) {
			gone = append(gone, d)
			return true
		}
		return false
	})
	comms = slices.DeleteFunc(comms, func(c *msg.Comm) bool { return slices.Contains(gone, c.Device()) })
	if len(gone) > 0 {
		r.mu.Lock()
		for _, d := range gone {
			delete(r.devices, d)
		}
		for c := range r.comms {
			if slices.Contains(gone, c.Device()) {
				delete(r.comms, c)
			}
		}
		r.mu.Unlock()
	}
	return devs, comms
}

// snapshot reads every counter of the registry's members.
func (r *Registry) snapshot() *snapshot {
	devs, comms := r.members()
	s := &snapshot{Devices: make([]deviceSnapshot, len(devs)), Comms: make([]commSnapshot, len(comms))}
	for i, dev := range devs {
		d := &s.Devices[i]
		d.Addr = dev.Addr().String()
		d.labels = `device="` + escapeLabel(d.Addr) + `"`
		d.Counters = dev.Counters()
		for _, id := range dev.CompletionHandlers() {
			if h, err := dev.HandlerStats(id); err == nil { // else removed since
				d.Handlers = append(d.Handlers, h)
			}
		}
		d.CM, d.SIDR = cm.DeviceCounters(dev), cm.DeviceSIDRCounters(dev)
		qps := dev.QPs()
		d.QPs = make([]qpSnapshot, len(qps))
		for j, q := range qps {
			qs := &d.QPs[j]
			qs.QPN = q.QPNum()
			qs.Counters = q.Counters()
			if q.SRQ() != nil {
				ls := q.LimitStats()
				qs.SRQ = &ls
			}
		}
		slices.SortFunc(d.QPs, func(a, b qpSnapshot) int { return cmp.Compare(a.QPN, b.QPN) })
		for j := range d.QPs {
			d.QPs[j].labels = d.labels + `,qpn="` + strconv.FormatUint(uint64(d.QPs[j].QPN), 10) + `"`
		}
	}
	for i, c := range comms {
		cs := &s.Comms[i]
		cs.Device, cs.Rank, cs.Size, cs.Stats = c.Device().Addr().String(), c.Rank(), c.Size(), c.Stats()
		cs.labels = `device="` + escapeLabel(cs.Device) + `",rank="` + strconv.Itoa(cs.Rank) + `"`
	}
	slices.SortFunc(s.Comms, func(a, b commSnapshot) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.Rank, b.Rank))
	})
	return s
}
