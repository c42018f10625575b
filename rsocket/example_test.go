package rsocket_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/netip"

	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// A stream between two devices on the loopback interface: the server echoes what the
// client writes, and the client reads it back after closing its writing side.
func Example() {
	// Each device has an address of its own and takes a free UDP port.
	serverDev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.2"), Port: verbs.AnyPort})
	if err != nil {
		log.Fatal(err)
	}
	defer serverDev.Close()
	clientDev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.1"), Port: verbs.AnyPort})
	if err != nil {
		log.Fatal(err)
	}
	defer clientDev.Close()

	l, err := rsocket.Listen(serverDev, 7471)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		_, err = io.Copy(c, c) // until the client's CloseWrite
		c.Close()
		served <- err
	}()

	// The listener's address is the server device's IP address and the service port;
	// DevicePort is the server device's UDP port (4791, RoCEv2's, when left zero).
	d := rsocket.Dialer{DevicePort: serverDev.Addr().Port()}
	c, err := d.Dial(context.Background(), clientDev, l.Addr().(*rsocket.Addr).AddrPort)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "hello over RDMA"); err != nil {
		log.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		log.Fatal(err)
	}
	reply, err := io.ReadAll(c)
	if err != nil {
		log.Fatal(err)
	}
	if err := <-served; err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", reply)
	// Output: hello over RDMA
}
