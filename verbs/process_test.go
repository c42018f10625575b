package verbs_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// helperEnv makes the test binary act as the peer process of TestSeparateProcesses.
const helperEnv = "SOFTRNIC_VERBS_TEST_PEER"

// Sizes and seeds both processes know.
const (
	peerMemSize  = 1 << 20 // the peer's remotely accessible region
	peerMemSeed  = 301     // its initial contents: pattern(peerMemSize, peerMemSeed)
	peerRecvSize = 64 << 10
)

// peerMsg is one line of the JSON protocol between the test and its peer process.
type peerMsg struct {
	// Connection setup, both ways.
	Endpoint *verbs.Endpoint `json:",omitempty"`
	Addr     uint64          `json:",omitempty"`
	RKey     uint32          `json:",omitempty"`
	// Commands to the peer: "recv" (report the next receive completion), "sum" (hash
	// Len bytes of its region at Off), "echo" (SEND the first Len received bytes back),
	// "exit".
	Cmd      string `json:",omitempty"`
	Off, Len int    `json:",omitempty"`
	// Replies.
	WRID    uint64         `json:",omitempty"`
	Status  verbs.WCStatus `json:",omitempty"`
	Opcode  verbs.WCOpcode `json:",omitempty"`
	ByteLen uint32         `json:",omitempty"`
	Imm     uint32         `json:",omitempty"`
	SrcQP   uint32         `json:",omitempty"`
	Sum     string         `json:",omitempty"`
	Err     string         `json:",omitempty"`
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// TestHelperProcess is the peer process of TestSeparateProcesses; run normally, it does
// nothing.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	code := 0
	if err := runPeer(os.Stdin, os.Stdout); err != nil {
		json.NewEncoder(os.Stdout).Encode(peerMsg{Err: err.Error()})
		fmt.Fprintln(os.Stderr, "peer:", err)
		code = 1
	}
	os.Exit(code) // before the testing package prints anything on stdout
}

// runPeer is the peer process: one device on 127.0.0.2, one RC QP, a 1 MiB region open
// for remote read and write, and a receive buffer; it follows the commands on in and
// answers on out. It ends on "exit", on EOF (the test is gone) or after a minute.
func runPeer(in io.Reader, out io.Writer) error {
	deadline := time.Now().Add(time.Minute)
	ctx, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: ipB, Port: verbs.AnyPort, Faults: &verbs.Faults{}})
	if err != nil {
		return err
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		return err
	}
	cq, err := ctx.CreateCQ(64, nil, 0)
	if err != nil {
		return err
	}
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: defaultCap})
	if err != nil {
		return err
	}
	mem, err := pd.RegMR(pattern(peerMemSize, peerMemSeed), allAccess)
	if err != nil {
		return err
	}
	rbuf, err := pd.RegMR(make([]byte, peerRecvSize), verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	dec := json.NewDecoder(in)
	ep := qp.Endpoint(0x500)
	if err := enc.Encode(peerMsg{Endpoint: &ep, Addr: mem.Addr(), RKey: mem.RKey()}); err != nil {
		return err
	}
	var hello peerMsg
	if err := dec.Decode(&hello); err != nil {
		return fmt.Errorf("reading the test's endpoint: %w", err)
	}
	if hello.Endpoint == nil {
		return errors.New("no endpoint from the test")
	}
	if err := qp.Connect(0x500, *hello.Endpoint, verbs.ConnectOptions{Timeout: 14}); err != nil {
		return err
	}
	if err := qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{rbuf.SGE(0, peerRecvSize)}}}); err != nil {
		return err
	}
	if err := enc.Encode(peerMsg{Cmd: "ready"}); err != nil {
		return err
	}
	poll := func() (verbs.WorkCompletion, error) {
		wc := make([]verbs.WorkCompletion, 1)
		for cq.PollCQ(wc) == 0 {
			if time.Now().After(deadline) {
				return wc[0], errors.New("timed out polling for a completion")
			}
			runtime.Gosched()
		}
		return wc[0], nil
	}
	received := 0
	for {
		var m peerMsg
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		var reply peerMsg
		switch m.Cmd {
		case "recv":
			wc, err := poll()
			if err != nil {
				return err
			}
			received = int(wc.ByteLen)
			reply = peerMsg{WRID: wc.WRID, Status: wc.Status, Opcode: wc.Opcode, ByteLen: wc.ByteLen, Imm: wc.ImmData,
				SrcQP: wc.SrcQP, Sum: sum(rbuf.Buf()[:min(received, peerRecvSize)])}
		case "sum":
			if m.Off < 0 || m.Len < 0 || m.Off+m.Len > peerMemSize {
				return fmt.Errorf("sum of [%d, %d) is outside the region", m.Off, m.Off+m.Len)
			}
			reply = peerMsg{Sum: sum(mem.Buf()[m.Off : m.Off+m.Len])}
		case "echo":
			if err := qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled,
				SGList: []verbs.SGE{rbuf.SGE(0, min(m.Len, received))}}}); err != nil {
				return err
			}
			wc, err := poll()
			if err != nil {
				return err
			}
			reply = peerMsg{WRID: wc.WRID, Status: wc.Status, Opcode: wc.Opcode}
		case "exit":
			return nil
		default:
			return fmt.Errorf("unknown command %q", m.Cmd)
		}
		if err := enc.Encode(reply); err != nil {
			return err
		}
	}
}

// lockedBuffer collects the peer's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSeparateProcesses checks verbs between two OS processes (the test binary runs
// itself as the peer): they exchange endpoints, an address and an rkey over a pipe as
// programs do out of band, connect, and then a SEND with immediate, an RDMA WRITE into
// the peer's memory, an RDMA READ of it and a SEND back all carry the right bytes.
func TestSeparateProcesses(t *testing.T) {
	// The peer is killed if the test takes longer than a minute; cancel runs last, after
	// the cleanup below has let the peer exit on its own.
	ctxTimeout, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctxTimeout, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			stdin.Close() // the peer stops at EOF
			if err := cmd.Wait(); err != nil {
				t.Errorf("peer process: %v", err)
			}
		}
		if s := stderr.String(); s != "" && t.Failed() {
			t.Logf("peer stderr:\n%s", s)
		}
	})
	enc := json.NewEncoder(stdin)
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 64<<10), 1<<20)
	call := func(m *peerMsg) peerMsg {
		t.Helper()
		if m != nil {
			if err := enc.Encode(m); err != nil {
				t.Fatalf("writing to the peer: %v", err)
			}
		}
		for lines.Scan() {
			line := lines.Bytes()
			if !bytes.HasPrefix(line, []byte("{")) {
				t.Logf("peer: %s", line)
				continue
			}
			var r peerMsg
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("peer sent %q: %v", line, err)
			}
			if r.Err != "" {
				t.Fatalf("peer failed: %s", r.Err)
			}
			return r
		}
		t.Fatalf("peer closed its output (%v); stderr:\n%s", lines.Err(), stderr.String())
		return peerMsg{}
	}

	// Out-of-band setup: the peer's endpoint, address and rkey; then ours.
	hello := call(nil)
	if hello.Endpoint == nil || hello.RKey == 0 {
		t.Fatalf("peer's first message %+v has no endpoint or rkey", hello)
	}
	peerEP := *hello.Endpoint
	if peerEP.GID != verbs.GIDFromAddr(ipB) {
		t.Errorf("peer's GID %v, want %v", peerEP.GID, ipB)
	}
	me := newSide(t, openDevice(t, ipA, verbs.DeviceConfig{}), defaultCap, 64, false)
	if err := me.qp.Connect(0x700, peerEP, verbs.ConnectOptions{Timeout: 14}); err != nil {
		t.Fatal(err)
	}
	ep := me.qp.Endpoint(0x700)
	if r := call(&peerMsg{Endpoint: &ep}); r.Cmd != "ready" {
		t.Fatalf("peer answered %+v, want ready", r)
	}

	// SEND with immediate to the peer.
	msg := mustReg(t, me.pd, pattern(peerRecvSize, 310), verbs.AccessLocalWrite)
	mustPostSend(t, me.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRSendWithImm, ImmData: 0xFEEDF00D, SendFlags: verbs.SendSignaled,
		SGList: sge(msg, 0, 50000)})
	wantSendWC(t, pollOne(t, me.scq), 1, verbs.WCSend, me.qp)
	r := call(&peerMsg{Cmd: "recv"})
	if r.WRID != 1 || r.Status != verbs.WCSuccess || r.Opcode != verbs.WCRecv || r.ByteLen != 50000 || r.Imm != 0xFEEDF00D ||
		r.SrcQP != me.qp.QPNum() || r.Sum != sum(msg.Buf()[:50000]) {
		t.Errorf("peer's receive completion %+v, want 50000 bytes with immediate 0xFEEDF00D, sum %s", r, sum(msg.Buf()[:50000]))
	}

	// RDMA WRITE into the peer's region, checked by the peer.
	const wOff, wLen = 4096, 512 << 10
	data := mustReg(t, me.pd, pattern(wLen, 311), 0)
	mustPostSend(t, me.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(data, 0, wLen), RemoteAddr: hello.Addr + wOff, RKey: hello.RKey})
	wantSendWC(t, pollOne(t, me.scq), 2, verbs.WCRDMAWrite, me.qp)
	if r := call(&peerMsg{Cmd: "sum", Off: wOff, Len: wLen}); r.Sum != sum(data.Buf()) {
		t.Errorf("peer's region after the WRITE hashes to %s, want %s", r.Sum, sum(data.Buf()))
	}
	if r := call(&peerMsg{Cmd: "sum", Off: 0, Len: wOff}); r.Sum != sum(pattern(peerMemSize, peerMemSeed)[:wOff]) {
		t.Errorf("the WRITE changed the peer's region before its target")
	}

	// RDMA READ of the peer's region: untouched bytes, then the ones just written.
	back := mustReg(t, me.pd, make([]byte, 300000), verbs.AccessLocalWrite)
	const rOff = 600000
	mustPostSend(t, me.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
		SGList: sge(back, 0, 300000), RemoteAddr: hello.Addr + rOff, RKey: hello.RKey})
	wantSendWC(t, pollOne(t, me.scq), 3, verbs.WCRDMARead, me.qp)
	checkBytes(t, "READ from the peer", back.Buf(), pattern(peerMemSize, peerMemSeed)[rOff:rOff+300000])
	mustPostSend(t, me.qp, verbs.SendWR{WRID: 4, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
		SGList: sge(back, 0, 1000), RemoteAddr: hello.Addr + wOff + 77, RKey: hello.RKey})
	wantSendWC(t, pollOne(t, me.scq), 4, verbs.WCRDMARead, me.qp)
	checkBytes(t, "READ of written bytes", back.Buf()[:1000], data.Buf()[77:1077])

	// The peer sends the message back.
	echo := mustReg(t, me.pd, make([]byte, peerRecvSize), verbs.AccessLocalWrite)
	mustPostRecv(t, me.qp, verbs.RecvWR{WRID: 5, SGList: sge(echo, 0, peerRecvSize)})
	if r := call(&peerMsg{Cmd: "echo", Len: 50000}); r.Status != verbs.WCSuccess || r.Opcode != verbs.WCSend {
		t.Errorf("peer's send completion %+v", r)
	}
	if wc := pollOne(t, me.rcq); wc.WRID != 5 || wc.Status != verbs.WCSuccess || wc.ByteLen != 50000 || wc.SrcQP != peerEP.QPNum {
		t.Errorf("receive completion %+v", wc)
	}
	checkBytes(t, "message sent back", echo.Buf()[:50000], msg.Buf()[:50000])

	if err := enc.Encode(peerMsg{Cmd: "exit"}); err != nil {
		t.Fatal(err)
	}
	exited = true
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("peer process: %v\n%s", err, strings.TrimSpace(stderr.String()))
	}
}
