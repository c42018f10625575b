package main

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// client is the dialing side: one device, one PD, one CQ, a new RC QP per connection.
type client struct {
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
}

func newClient(dev *verbs.Device) (*client, error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	// No work request is ever posted: the CQ stays empty.
	cq, err := dev.CreateCQ(16, nil, 0)
	if err != nil {
		return nil, err
	}
	return &client{dev: dev, pd: pd, cq: cq}, nil
}

// roundConfig is one round: n connections, c Dials in flight.
type roundConfig struct {
	n, c, dc        int // connections, Dials in flight, Disconnects in flight
	remote          netip.AddrPort
	devicePort      uint16
	ordering        verbs.Ordering
	responseTimeout time.Duration
	limit           time.Duration // bound on each Dial and on the whole round
}

// roundResult is what the client measured in one round.
type roundResult struct {
	Established int
	Failures    int
	FirstError  string
	Seconds     float64         // first Dial to the last established
	Latencies   []time.Duration // each successful Dial's own duration, sorted
	Weak        int             // connections that ended up weakly ordered
	CM          cm.Counters     // the client's connection manager: the round's delta (connect phase)
	DevDropped  uint64

	Disconnects        int
	DisconnectFailures int
	DisconnectError    string
	DisconnectSeconds  float64
	DisconnectCM       cm.Counters // the disconnect phase's delta
	DestroySeconds     float64
}

// connect dials n connections, c at a time, and returns them (nil where a Dial failed)
// with the QPs.
func (cl *client) connect(rc roundConfig) ([]*cm.Conn, []*verbs.QP, roundResult, error) {
	var res roundResult
	qps := make([]*verbs.QP, rc.n)
	for i := range qps {
		qp, err := cl.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cl.cq, RecvCQ: cl.cq,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			for _, q := range qps[:i] {
				_ = q.DestroyQP()
			}
			return nil, nil, res, fmt.Errorf("creating QP %d: %w", i, err)
		}
		qps[i] = qp
	}
	conns := make([]*cm.Conn, rc.n)
	lat := make([]time.Duration, rc.n)
	errs := make([]error, rc.n)
	ctx, cancel := context.WithTimeout(context.Background(), rc.limit)
	defer cancel()
	base, baseDev := cm.DeviceCounters(cl.dev), cl.dev.Counters()
	var next atomic.Int64
	var last atomic.Int64 // the latest successful Dial's return, ns since start
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < min(rc.c, rc.n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= rc.n {
					return
				}
				p := &cm.DialParams{DevicePort: rc.devicePort, ResponseTimeout: rc.responseTimeout,
					Options: verbs.ConnectOptions{Ordering: rc.ordering}}
				t0 := time.Now()
				c, err := cm.Dial(ctx, cl.dev, rc.remote, qps[i], p)
				t1 := time.Now()
				lat[i], conns[i], errs[i] = t1.Sub(t0), c, err
				if err == nil {
					for end := int64(t1.Sub(start)); ; {
						old := last.Load()
						if end <= old || last.CompareAndSwap(old, end) {
							break
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	res.Seconds = time.Duration(last.Load()).Seconds()
	res.CM = diffStats(cm.DeviceCounters(cl.dev), base)
	res.DevDropped = cl.dev.Counters().Dropped - baseDev.Dropped
	for i, err := range errs {
		if err != nil {
			res.Failures++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			continue
		}
		res.Established++
		res.Latencies = append(res.Latencies, lat[i])
		if conns[i].Ordering() == verbs.OrderingWeak {
			res.Weak++
		}
	}
	slices.Sort(res.Latencies)
	return conns, qps, res, nil
}

// disconnect ends every connection, dc at a time, and destroys the QPs.
func (cl *client) disconnect(rc roundConfig, conns []*cm.Conn, qps []*verbs.QP, res *roundResult) {
	base := cm.DeviceCounters(cl.dev)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := time.Now()
	for w := 0; w < min(rc.dc, len(conns)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(conns) {
					return
				}
				if conns[i] == nil {
					continue
				}
				err := conns[i].Disconnect()
				mu.Lock()
				res.Disconnects++
				if err != nil {
					res.DisconnectFailures++
					if res.DisconnectError == "" {
						res.DisconnectError = err.Error()
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.DisconnectSeconds = time.Since(start).Seconds()
	res.DisconnectCM = diffStats(cm.DeviceCounters(cl.dev), base)
	start = time.Now()
	for _, qp := range qps {
		_ = qp.DestroyQP()
	}
	res.DestroySeconds = time.Since(start).Seconds()
}

// diffStats is a - b, field by field.
func diffStats(a, b cm.Counters) cm.Counters {
	return cm.Counters{
		REQSent: a.REQSent - b.REQSent, REQRetries: a.REQRetries - b.REQRetries, REQDuplicates: a.REQDuplicates - b.REQDuplicates,
		REPSent: a.REPSent - b.REPSent, REPRetries: a.REPRetries - b.REPRetries, RTUSent: a.RTUSent - b.RTUSent,
		MRASent: a.MRASent - b.MRASent, MRAReceived: a.MRAReceived - b.MRAReceived,
		REJSent: a.REJSent - b.REJSent, REJReceived: a.REJReceived - b.REJReceived,
		DREQSent: a.DREQSent - b.DREQSent, DREQRetries: a.DREQRetries - b.DREQRetries, DREPSent: a.DREPSent - b.DREPSent,
		Established: a.Established - b.Established, Disconnected: a.Disconnected - b.Disconnected, StaleRejects: a.StaleRejects - b.StaleRejects,
		Dropped: a.Dropped - b.Dropped, BacklogDrops: a.BacklogDrops - b.BacklogDrops,
		KeepAliveProbes: a.KeepAliveProbes - b.KeepAliveProbes, PeersLost: a.PeersLost - b.PeersLost,
		SendErrors: a.SendErrors - b.SendErrors,
	}
}

// percentile is the nearest-rank percentile of sorted durations (0 if none).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(d))*p)) - 1
	return d[min(max(i, 0), len(d)-1)]
}
