package metrics

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// ContentType is the media type of the Prometheus text exposition format ServeHTTP
// writes.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// ServeHTTP writes the registry's counters in the Prometheus text exposition format:
// one family per metric, sorted by name, each with its HELP and TYPE lines, its samples
// sorted by their labels.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	e := encoders.Get().(*encoder)
	e.b = e.b[:0]
	e.write(r.snapshot())
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Content-Length", strconv.Itoa(len(e.b)))
	if req.Method != http.MethodHead {
		_, _ = w.Write(e.b)
	}
	if cap(e.b) <= maxKeptBuffer {
		encoders.Put(e)
	}
}

// maxKeptBuffer bounds the text buffer kept for the next scrape.
const maxKeptBuffer = 32 << 20

var encoders = sync.Pool{New: func() any { return new(encoder) }}

// encoder appends the text format to b.
type encoder struct{ b []byte }

// family is one metric: its name, type, help, and how its samples are written from a
// snapshot.
type family struct {
	name, typ, help string
	write           func(e *encoder, s *snapshot, name string)
}

// families are every metric published, sorted by name.
var families = buildFamilies()

func (e *encoder) write(s *snapshot) {
	for i := range families {
		f := &families[i]
		e.header(f.name, f.typ, f.help)
		f.write(e, s, f.name)
	}
}

func (e *encoder) header(name, typ, help string) {
	e.b = append(e.b, "# HELP "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = appendEscaped(e.b, help, false)
	e.b = append(e.b, "\n# TYPE "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, typ...)
	e.b = append(e.b, '\n')
}

// series starts a sample: the name and the labels (base, escaped already, and k=v).
func (e *encoder) series(name, base, k, v string) {
	e.b = append(e.b, name...)
	if base == "" && k == "" {
		return
	}
	e.b = append(e.b, '{')
	e.b = append(e.b, base...)
	if k != "" {
		if base != "" {
			e.b = append(e.b, ',')
		}
		e.b = append(e.b, k...)
		e.b = append(e.b, `="`...)
		e.b = appendEscaped(e.b, v, true)
		e.b = append(e.b, '"')
	}
	e.b = append(e.b, '}')
}

func (e *encoder) uint(name, base, k, v string, x uint64) {
	e.series(name, base, k, v)
	e.b = append(e.b, ' ')
	e.b = strconv.AppendUint(e.b, x, 10)
	e.b = append(e.b, '\n')
}

func (e *encoder) float(name, base, k, v string, x float64) {
	e.series(name, base, k, v)
	e.b = append(e.b, ' ')
	switch {
	case math.IsNaN(x):
		e.b = append(e.b, "NaN"...)
	case math.IsInf(x, 1):
		e.b = append(e.b, "+Inf"...)
	case math.IsInf(x, -1):
		e.b = append(e.b, "-Inf"...)
	default:
		e.b = strconv.AppendFloat(e.b, x, 'g', -1, 64)
	}
	e.b = append(e.b, '\n')
}

// appendEscaped appends s escaped as the format wants: backslash and newline (and, in a
// label value, the double quote) as \\, \n and \".
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// escapeLabel returns s escaped as a label value.
func escapeLabel(s string) string { return string(appendEscaped(nil, s, true)) }

func seconds(d time.Duration) float64 { return d.Seconds() }

// about prefixes a counter's help with what it belongs to: "Connection manager:
// connections established."
func about(what, help string) string {
	if help != "" && help[0] >= 'A' && help[0] <= 'Z' && (len(help) < 2 || help[1] < 'A' || help[1] > 'Z') {
		help = string(help[0]+'a'-'A') + help[1:]
	}
	return what + ": " + help
}

// labelName turns a name made for people ("hard RNR", "SRQ entries held") into a label
// value in the style of metric names ("hard_rnr", "srq_entries_held").
func labelName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, s)
}

var (
	limitKinds = func() []string {
		k := make([]string, verbs.NumLimits)
		for i := range k {
			k[i] = labelName(verbs.LimitKind(i).String())
		}
		return k
	}()
	decisions = func() []string {
		d := make([]string, verbs.NumDecisions)
		for i := range d {
			d[i] = labelName(verbs.Decision(i).String())
		}
		return d
	}()
	quantiles = []struct {
		label string
		get   func(*verbs.LatencySummary) time.Duration
	}{
		{"0.5", func(l *verbs.LatencySummary) time.Duration { return l.P50 }},
		{"0.99", func(l *verbs.LatencySummary) time.Duration { return l.P99 }},
		{"0.999", func(l *verbs.LatencySummary) time.Duration { return l.P999 }},
	}
)

// Metric name prefixes.
const (
	prefix        = "softrnic_"
	devicePrefix  = prefix + "device_"
	queuePrefix   = prefix + "device_queue_"
	qpPrefix      = prefix + "qp_"
	handlerPrefix = prefix + "handler_"
	cmPrefix      = prefix + "cm_"
	sidrPrefix    = prefix + "cm_sidr_"
	msgPrefix     = prefix + "msg_"
)

func buildFamilies() []family {
	var fs []family
	add := func(name, typ, help string, write func(e *encoder, s *snapshot, name string)) {
		fs = append(fs, family{name: name, typ: typ, help: help, write: write})
	}
	eachDevice := func(get func(*deviceSnapshot) uint64) func(*encoder, *snapshot, string) {
		return func(e *encoder, s *snapshot, name string) {
			for i := range s.Devices {
				e.uint(name, s.Devices[i].labels, "", "", get(&s.Devices[i]))
			}
		}
	}
	for _, c := range packetCounters {
		add(devicePrefix+c.name+"_total", "counter", c.help+" Sum over the device's QPs, live and destroyed.",
			eachDevice(func(d *deviceSnapshot) uint64 { return c.get(&d.Counters) }))
	}
	for _, c := range deviceCounters {
		add(devicePrefix+c.name+"_total", "counter", c.help, eachDevice(func(d *deviceSnapshot) uint64 { return c.get(&d.Counters) }))
	}
	add(devicePrefix+"qps", "gauge", "QPs the device has (created and not destroyed; QP1 not counted).",
		eachDevice(func(d *deviceSnapshot) uint64 { return uint64(len(d.QPs)) }))
	for _, c := range queueCounters {
		add(queuePrefix+c.name+"_total", "counter", c.help, func(e *encoder, s *snapshot, name string) {
			for i := range s.Devices {
				d := &s.Devices[i]
				for q := range d.Counters.Queues {
					e.uint(name, d.labels, "queue", strconv.Itoa(q), c.get(&d.Counters.Queues[q]))
				}
			}
		})
	}

	eachQP := func(get func(*qpSnapshot) uint64, srqOnly bool) func(*encoder, *snapshot, string) {
		return func(e *encoder, s *snapshot, name string) {
			for i := range s.Devices {
				for j := range s.Devices[i].QPs {
					if q := &s.Devices[i].QPs[j]; !srqOnly || q.SRQ != nil {
						e.uint(name, q.labels, "", "", get(q))
					}
				}
			}
		}
	}
	for _, c := range packetCounters {
		add(qpPrefix+c.name+"_total", "counter", c.help, eachQP(func(q *qpSnapshot) uint64 { return c.get(&q.Counters) }, false))
	}
	for _, c := range srqCounters {
		add(qpPrefix+"srq_"+c.name+"_total", "counter", c.help+" QPs on an SRQ only.",
			eachQP(func(q *qpSnapshot) uint64 { return c.get(q.SRQ) }, true))
	}
	eachSRQ := func(f func(e *encoder, name string, q *qpSnapshot)) func(*encoder, *snapshot, string) {
		return func(e *encoder, s *snapshot, name string) {
			for i := range s.Devices {
				for j := range s.Devices[i].QPs {
					if q := &s.Devices[i].QPs[j]; q.SRQ != nil {
						f(e, name, q)
					}
				}
			}
		}
	}
	perLimit := func(get func(*verbs.LimitStats, int) uint64) func(*encoder, *snapshot, string) {
		return eachSRQ(func(e *encoder, name string, q *qpSnapshot) {
			for k, kind := range limitKinds {
				e.uint(name, q.labels, "limit", kind, get(q.SRQ, k))
			}
		})
	}
	add(qpPrefix+"srq_soft_limit_hits_total", "counter", "Times the QP reached a soft limit of its limit queue, by limit.",
		perLimit(func(l *verbs.LimitStats, k int) uint64 { return l.SoftHits[k] }))
	add(qpPrefix+"srq_hard_limit_hits_total", "counter", "Times the QP reached a hard limit of its limit queue, by limit.",
		perLimit(func(l *verbs.LimitStats, k int) uint64 { return l.HardHits[k] }))
	add(qpPrefix+"srq_limit_usage", "gauge", "What the QP holds now of each dimension its limit queue bounds.",
		perLimit(func(l *verbs.LimitStats, k int) uint64 { return uint64(l.Usage[k]) }))
	add(qpPrefix+"srq_limit_peak", "gauge", "The most the QP held of each dimension its limit queue bounds.",
		perLimit(func(l *verbs.LimitStats, k int) uint64 { return uint64(l.Peak[k]) }))
	add(qpPrefix+"srq_decisions_total", "counter", "The limit queue's decisions on the QP's requests at a limit, by decision.",
		eachSRQ(func(e *encoder, name string, q *qpSnapshot) {
			for d, what := range decisions {
				e.uint(name, q.labels, "decision", what, q.SRQ.Decisions[d])
			}
		}))
	add(qpPrefix+"srq_share", "gauge", "The QP's statistical share of its SRQ, in WQEs per second (0: none set).",
		eachSRQ(func(e *encoder, name string, q *qpSnapshot) { e.float(name, q.labels, "", "", q.SRQ.Share) }))
	add(qpPrefix+"srq_tokens", "gauge", "The QP's token bucket: positive while it keeps within its share.",
		eachSRQ(func(e *encoder, name string, q *qpSnapshot) { e.float(name, q.labels, "", "", q.SRQ.Tokens) }))
	add(qpPrefix+"srq_dropped", "gauge", "1 if the limit queue dropped the QP's connection, else 0.",
		eachSRQ(func(e *encoder, name string, q *qpSnapshot) {
			var v uint64
			if q.SRQ.Dropped {
				v = 1
			}
			e.uint(name, q.labels, "", "", v)
		}))

	eachHandler := func(f func(e *encoder, name, labels string, h *verbs.HandlerStats)) func(*encoder, *snapshot, string) {
		return func(e *encoder, s *snapshot, name string) {
			for i := range s.Devices {
				d := &s.Devices[i]
				for j := range d.Handlers {
					h := &d.Handlers[j]
					f(e, name, d.labels+`,handler="`+strconv.Itoa(h.Handler)+`"`, h)
				}
			}
		}
	}
	for _, c := range handlerCounters {
		add(handlerPrefix+c.name+"_total", "counter", about("Completion handlers", c.help),
			eachHandler(func(e *encoder, name, labels string, h *verbs.HandlerStats) { e.uint(name, labels, "", "", c.get(h)) }))
	}
	add(handlerPrefix+"pending", "gauge", "Completion handlers: events queued and not yet dispatched.",
		eachHandler(func(e *encoder, name, labels string, h *verbs.HandlerStats) {
			e.uint(name, labels, "", "", uint64(h.Pending))
		}))
	add(handlerPrefix+"latency_seconds", "summary",
		"Completion handlers: time from the completion that raised an event to the call of the handler's function (log-linear histogram, within 12.5%; the sum is the mean times the count).",
		eachHandler(func(e *encoder, name, labels string, h *verbs.HandlerStats) {
			l := &h.Latency
			for _, q := range quantiles {
				e.float(name, labels, "quantile", q.label, seconds(q.get(l)))
			}
			e.float(name+"_sum", labels, "", "", seconds(l.Mean)*float64(l.Count))
			e.uint(name+"_count", labels, "", "", l.Count)
		}))
	add(handlerPrefix+"latency_max_seconds", "gauge", "Completion handlers: the longest time from a completion to the call of the handler's function.",
		eachHandler(func(e *encoder, name, labels string, h *verbs.HandlerStats) {
			e.float(name, labels, "", "", seconds(h.Latency.Max))
		}))

	for _, c := range cmCounters {
		add(cmPrefix+c.name+"_total", "counter", about("Connection manager", c.help),
			eachDevice(func(d *deviceSnapshot) uint64 { return c.get(&d.CM) }))
	}
	for _, c := range sidrCounters {
		add(sidrPrefix+c.name+"_total", "counter", about("Connection manager, service ID resolution", c.help),
			eachDevice(func(d *deviceSnapshot) uint64 { return c.get(&d.SIDR) }))
	}
	for _, c := range msgCounters {
		add(msgPrefix+c.name+"_total", "counter", about("Messaging (msg)", c.help), func(e *encoder, s *snapshot, name string) {
			for i := range s.Comms {
				e.uint(name, s.Comms[i].labels, "", "", c.get(&s.Comms[i].Stats))
			}
		})
	}
	add(msgPrefix+"ranks", "gauge", "Messaging (msg): the ranks of the communicator's job.", func(e *encoder, s *snapshot, name string) {
		for i := range s.Comms {
			e.uint(name, s.Comms[i].labels, "", "", uint64(s.Comms[i].Size))
		}
	})
	slices.SortFunc(fs, func(a, b family) int { return strings.Compare(a.name, b.name) })
	return fs
}
