package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"

	"github.com/softrnic/softrnic/rsocket"
)

// waitLimit bounds each test: the guard against a hang, not a measure of speed.
const waitLimit = 2 * time.Minute

// TestRun runs what go run . runs and checks what it prints.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	want := `server: gRPC health service on rsocket 127.0.0.2:50051
client: Check("") = SERVING
client: Watch("example.Echo") = SERVING
server: sets example.Echo to NOT_SERVING
client: Watch("example.Echo") = NOT_SERVING
`
	if out.String() != want {
		t.Errorf("run printed\n%s\nwant\n%s", out.String(), want)
	}
}

// rawCodec passes *[]byte messages through as they are: the echo service's encoding,
// which needs no generated code. Clients ask for it with grpc.CallContentSubtype.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "raw" }

func init() { encoding.RegisterCodecV2(rawCodec{}) }

// echoService is a bidirectional stream that sends back every message it receives.
var echoService = grpc.ServiceDesc{
	ServiceName: "example.Echo",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Echo",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			for {
				var msg []byte
				if err := stream.RecvMsg(&msg); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
				if err := stream.SendMsg(&msg); err != nil {
					return err
				}
			}
		},
	}},
}

// echo sends each message on a new echo stream and checks that it comes back intact.
func echo(ctx context.Context, cc *grpc.ClientConn, msgs ...[]byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cc.NewStream(ctx, &echoService.Streams[0], "/example.Echo/Echo", grpc.CallContentSubtype("raw"))
	if err != nil {
		return err
	}
	for i, msg := range msgs {
		if err := stream.SendMsg(&msg); err != nil {
			return fmt.Errorf("send message %d: %w", i, err)
		}
		var got []byte
		if err := stream.RecvMsg(&got); err != nil {
			return fmt.Errorf("receive message %d: %w", i, err)
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("message %d of %d bytes came back as %d bytes, not the same", i, len(msg), len(got))
		}
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	var extra []byte
	if err := stream.RecvMsg(&extra); !errors.Is(err, io.EOF) {
		return fmt.Errorf("stream end: %v, want io.EOF", err)
	}
	return nil
}

// pattern is n bytes that differ from one message to the next.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// TestGRPC serves the health and echo services over rsocket and calls them: unary
// calls one after another and from several goroutines at once, a server stream that
// follows status changes, and bidirectional streams of messages up to 1 MiB.
func TestGRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	serverDev, err := openDevice("127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	defer serverDev.Close()
	clientDev, err := openDevice("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer clientDev.Close()

	lis, err := rsocket.Listen(serverDev, servicePort)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	gs.RegisterService(&echoService, struct{}{})
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()

	cc, err := dial(clientDev, netip.AddrPortFrom(serverDev.Addr().Addr(), servicePort), serverDev.Addr().Port())
	if err != nil {
		t.Fatal(err)
	}
	client := healthpb.NewHealthClient(cc)

	t.Run("unary", func(t *testing.T) {
		for i := range 100 {
			resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("call %d: %v, want SERVING", i, resp.GetStatus())
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				for range 50 {
					if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		// A service the server does not know is an error the call returns.
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "unknown"}); err == nil {
			t.Error("Check of an unknown service succeeded")
		}
	})

	t.Run("server stream", func(t *testing.T) {
		const service = "example.Echo"
		hs.SetServingStatus(service, healthpb.HealthCheckResponse_SERVING)
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		stream, err := client.Watch(wctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		statuses := []healthpb.HealthCheckResponse_ServingStatus{
			healthpb.HealthCheckResponse_SERVING,
			healthpb.HealthCheckResponse_NOT_SERVING,
			healthpb.HealthCheckResponse_SERVING,
		}
		for i, want := range statuses {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetStatus() != want {
				t.Fatalf("update %d: %v, want %v", i, resp.GetStatus(), want)
			}
			if i+1 < len(statuses) {
				hs.SetServingStatus(service, statuses[i+1])
			}
		}
	})

	t.Run("bidi stream", func(t *testing.T) {
		if err := echo(ctx, cc, pattern(0, 1), pattern(100, 2), pattern(1<<20, 3), pattern(1, 4)); err != nil {
			t.Fatal(err)
		}
		// Several streams at once share the connection.
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for k := range 4 {
			wg.Go(func() {
				msgs := make([][]byte, 20)
				for i := range msgs {
					msgs[i] = pattern(1+(k*20+i)*3000, byte(k*20+i))
				}
				if err := echo(ctx, cc, msgs...); err != nil {
					errs <- fmt.Errorf("stream %d: %w", k, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	if err := cc.Close(); err != nil {
		t.Error(err)
	}
	gs.GracefulStop()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
