// Command grpc runs a gRPC server and a client that reach each other over rsocket
// streams between two softrnic devices on the loopback interface: every HTTP/2
// connection gRPC makes is an RC connection carrying librdmacm's rsocket protocol.
// The service is gRPC's standard health service, which needs no generated code of
// its own: the client checks the server's health (a unary call) and watches a
// service's status change (a server stream).
//
//	go run .
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// servicePort is the rsocket service port the gRPC server listens on.
const servicePort = 50051

func main() {
	log.SetFlags(0)
	if err := run(context.Background(), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// openDevice opens a softrnic device on addr with a free UDP port.
func openDevice(addr string) (*verbs.Device, error) {
	return verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr(addr), Port: verbs.AnyPort})
}

// server is a gRPC server with the health service, serving on an rsocket listener.
type server struct {
	grpc   *grpc.Server
	health *health.Server
	lis    *rsocket.Listener
	served chan error // Serve's result
}

// startServer serves gRPC on port of dev.
func startServer(dev *verbs.Device, port uint16) (*server, error) {
	lis, err := rsocket.Listen(dev, port)
	if err != nil {
		return nil, err
	}
	s := &server{grpc: grpc.NewServer(), health: health.NewServer(), lis: lis, served: make(chan error, 1)}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	go func() { s.served <- s.grpc.Serve(lis) }()
	return s, nil
}

// stop ends the server's calls and connections, and returns Serve's error, if any.
func (s *server) stop() error {
	s.health.Shutdown() // watchers see NOT_SERVING
	s.grpc.GracefulStop()
	return <-s.served
}

// dial returns a gRPC client whose every connection is an rsocket from dev to the
// listener at addr, on the peer device whose UDP port is devicePort. The target only
// names the server: the dialer ignores it.
func dial(dev *verbs.Device, addr netip.AddrPort, devicePort uint16) (*grpc.ClientConn, error) {
	d := rsocket.Dialer{DevicePort: devicePort}
	return grpc.NewClient("passthrough:///"+addr.String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return d.Dial(ctx, dev, addr)
		}))
}

// run starts a server on one device and a client on another, makes a unary call and
// watches a status change over a stream, and tells w what it saw.
func run(ctx context.Context, w io.Writer) (err error) {
	serverDev, err := openDevice("127.0.0.2")
	if err != nil {
		return err
	}
	defer serverDev.Close()
	clientDev, err := openDevice("127.0.0.1")
	if err != nil {
		return err
	}
	defer clientDev.Close()

	srv, err := startServer(serverDev, servicePort)
	if err != nil {
		return err
	}
	defer func() {
		if serr := srv.stop(); err == nil {
			err = serr
		}
	}()
	addr := srv.lis.Addr().(*rsocket.Addr).AddrPort
	fmt.Fprintf(w, "server: gRPC health service on rsocket %v\n", addr)

	cc, err := dial(clientDev, addr, serverDev.Addr().Port())
	if err != nil {
		return err
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)

	// A unary call: the server as a whole.
	resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	fmt.Fprintf(w, "client: Check(\"\") = %v\n", resp.GetStatus())

	// A server stream: the status of one service, as the server changes it.
	const service = "example.Echo"
	srv.health.SetServingStatus(service, healthpb.HealthCheckResponse_SERVING)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Watch(wctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	resp, err = stream.Recv()
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	fmt.Fprintf(w, "client: Watch(%q) = %v\n", service, resp.GetStatus())
	fmt.Fprintf(w, "server: sets %s to NOT_SERVING\n", service)
	srv.health.SetServingStatus(service, healthpb.HealthCheckResponse_NOT_SERVING)
	resp, err = stream.Recv()
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	fmt.Fprintf(w, "client: Watch(%q) = %v\n", service, resp.GetStatus())
	return nil
}
