package msg

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/verbs"
)

// rankEnv carries the rendezvous address to the rank the test binary runs as a process.
const rankEnv = "SOFTRNIC_MSG_RANK1_ROOT"

// TestRankProcess is rank 1 of a 2-rank job (only when run by TestCloseKilledRank): it
// sends "hi" to rank 0, says so, and waits to be killed.
func TestRankProcess(t *testing.T) {
	root := os.Getenv(rankEnv)
	if root == "" {
		t.Skip("run by TestCloseKilledRank")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Init(ctx, Config{Rank: 1, Size: 2, Root: root, Device: verbs.DeviceConfig{Faults: &verbs.Faults{}}})
	if err != nil {
		os.Stdout.WriteString("error: " + err.Error() + "\n")
		os.Exit(1)
	}
	if err := c.Send(ctx, []byte("hi"), 0, 1); err != nil {
		os.Stdout.WriteString("error: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("sent\n")
	<-ctx.Done()
}

// A rank is killed with SIGKILL (no DisconnectRequest, its device silent): the surviving
// rank's Close still returns within its documented bound, one keep-alive period for the
// DisconnectRequest nobody answers, and not after the keep-alive gives up on the peer.
func TestCloseKilledRank(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	root := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, lines := testutil.StartChild(t, "TestRankProcess", rankEnv+"="+root)
	c, err := Init(ctx, Config{Rank: 0, Size: 2, Root: root, Device: verbs.DeviceConfig{Faults: &verbs.Faults{}}})
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := c.Recv(testutil.Context(t), b, 1, 1); err != nil || string(b) != "hi" {
		c.Close()
		t.Fatalf("Recv from rank 1: %q %v", b, err)
	}
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "sent") {
		if strings.HasPrefix(lines.Text(), "error: ") {
			c.Close()
			t.Fatalf("rank 1: %s", lines.Text())
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	start := time.Now()
	err = c.Close()
	t.Logf("Close after rank 1 was killed: %v after %v", err, time.Since(start))
	if err != nil {
		t.Errorf("Close: %v", err)
	}
}

// CloseContext with a cancelled context returns at once with the context's error, the
// rank closed all the same: its device is closed and its requests failed.
func TestCloseContextCancelled(t *testing.T) {
	comms := newJob(t, 2, Config{})
	ctx := testutil.Context(t)
	if err := comms[1].Send(ctx, []byte("hi"), 0, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := comms[0].Recv(ctx, make([]byte, 2), 1, 1); err != nil {
		t.Fatal(err)
	}
	pending := comms[0].Irecv(make([]byte, 2), 1, 2)
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	err := comms[0].CloseContext(cctx)
	t.Logf("CloseContext, cancelled: %v after %v", err, time.Since(start))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("CloseContext with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := pending.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("a receive pending at Close: %v, want ErrClosed", err)
	}
	if _, err := comms[0].dev.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("the device after CloseContext: AllocPD %v, want ErrClosed", err)
	}
	if err := comms[0].Close(); err != nil {
		t.Errorf("Close after CloseContext: %v", err)
	}
}
