package cm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The BenchmarkFailure* benchmarks measure how long the CM takes to settle a failure, one
// failure per iteration: ns/op is the time from the moment the failure can be known to the
// moment the caller has its error. They are the figures of the README's failure table:
//
//	go test -run '^$' -bench Failure -benchtime 20x ./cm/

// Dial to an address and port where no device runs: ErrPeerUnreachable from the host's
// ICMP port unreachable, in the first request's round trip.
func BenchmarkFailureDialClosedPort(b *testing.B) {
	da := verbstest.OpenDevice(b, verbstest.IPA, verbs.DeviceConfig{})
	remote := netip.MustParseAddrPort("127.0.0.1:7471")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		a := newEndpoint(b, da, 0)
		p := &DialParams{DevicePort: closedPort(b)}
		b.StartTimer()
		_, err := Dial(ctx, da, remote, a.QP, p)
		b.StopTimer()
		if !errors.Is(err, ErrPeerUnreachable) {
			b.Fatalf("Dial: %v, want ErrPeerUnreachable", err)
		}
	}
}

// connectTo opens a listening device at IPB and a dialing one at IPA (on port, 0: any),
// connects them with keep-alive every keepAlive, and returns both devices and connections.
func connectTo(b *testing.B, port uint16, keepAlive time.Duration) (da, db *verbs.Device, ca, cb *Conn) {
	db = openAt(b, verbstest.IPB, 0)
	l, err := Listen(db, testPort)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	eb := newEndpoint(b, db, 1)
	acc := make(chan *Conn, 1)
	go func() {
		defer close(acc)
		r, err := l.Accept(context.Background())
		if err != nil {
			return
		}
		c, _ := r.Accept(eb.QP, &AcceptParams{KeepAlive: keepAlive})
		acc <- c
	}()
	da = openAt(b, verbstest.IPA, port)
	ea := newEndpoint(b, da, 1)
	p := fast(nil)
	p.KeepAlive = keepAlive
	ca, err = Dial(context.Background(), da, remote(db, p), ea.QP, p)
	if err != nil {
		b.Fatalf("Dial: %v", err)
	}
	if cb = <-acc; cb == nil {
		b.Fatal("Accept failed")
	}
	return da, db, ca, cb
}

// Disconnect from a peer whose process died (its device gone, its port closed): the
// DisconnectRequest is answered by ICMP port unreachable, and Disconnect returns
// ErrPeerUnreachable in that round trip (without the report, after one keep-alive period).
func BenchmarkFailureDisconnectDeadPeer(b *testing.B) {
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		da, db, ca, _ := connectTo(b, 0, -1)
		vanish(b, db)
		b.StartTimer()
		err := ca.Disconnect()
		b.StopTimer()
		if !errors.Is(err, ErrPeerUnreachable) {
			b.Fatalf("Disconnect: %v, want ErrPeerUnreachable", err)
		}
		da.Close()
	}
}

// A client killed and a new one started on the same address and port (the half-open
// case): from the new device's opening, through its Dial, until the server's connection
// to the old one has ended with ErrPeerRestarted.
func BenchmarkFailurePeerRestarted(b *testing.B) {
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		da, db, _, old := connectTo(b, 0, -1)
		port := da.Addr().Port()
		vanish(b, da)
		l, err := Listen(db, testPort)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			if r, err := l.Accept(context.Background()); err == nil {
				r.Reject(nil)
			}
		}()
		b.StartTimer()
		da2 := openAt(b, verbstest.IPA, port)
		p := fast(nil)
		a2 := newEndpoint(b, da2, 0)
		go Dial(context.Background(), da2, remote(db, p), a2.QP, p) // rejected: what matters is its request
		<-old.Done()
		b.StopTimer()
		if !errors.Is(old.Err(), ErrPeerRestarted) {
			b.Fatalf("the old connection ended with %v, want ErrPeerRestarted", old.Err())
		}
		l.Close()
		da2.Close()
		db.Close()
	}
}
